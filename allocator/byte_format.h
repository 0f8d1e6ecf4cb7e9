// Human-readable byte counts for messages (OOM reports, ToString of configs and stats).
#ifndef DTR_ALLOCATOR_BYTE_FORMAT_H_
#define DTR_ALLOCATOR_BYTE_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace dtr::alloc {

// "1.50 MiB (1572864 bytes)": a binary-unit figure plus the exact count, so messages stay precise.
std::string FormatBytes(uint64_t bytes);

// Only the binary-unit figure, e.g. "20.00 MiB".
std::string FormatBytesShort(uint64_t bytes);

}  // namespace dtr::alloc

#endif  // DTR_ALLOCATOR_BYTE_FORMAT_H_
