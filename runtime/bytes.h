// Parsing and printing byte quantities ("6GiB", "512M", "1.5G", "123456"). Shared by the
// runtime's configuration, dtr-sim's --budget, the allocator's reports and the torch layer's
// DTR_BUDGET (library target dtr_bytes, which has no other dependency than abseil).
#ifndef DTR_RUNTIME_BYTES_H_
#define DTR_RUNTIME_BYTES_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtr {

// The largest quantity ParseBytes accepts: 2^60 bytes (1 EiB).
inline constexpr uint64_t kMaxByteQuantity = uint64_t(1) << 60;

// Accepts a non-negative number (integer or decimal) followed by an optional suffix: B, K/KB/M/MB/
// G/GB/T/TB (powers of 1000) or KiB/MiB/GiB/TiB (powers of 1024); case-insensitive except that
// "k" and "K" both mean 1000. Rejects negatives, quantities above kMaxByteQuantity, empty input
// and trailing garbage.
absl::StatusOr<uint64_t> ParseBytes(absl::string_view text);

// What ParseBytes accepts, for error messages.
absl::string_view AcceptedByteForms();

// "1.50 GiB (1610612736 bytes)": a binary-unit figure plus the exact count; "12 B" below 1 KiB.
std::string FormatBytes(uint64_t bytes);
// Only the binary-unit figure, e.g. "20.00 MiB".
std::string FormatBytesShort(uint64_t bytes);

}  // namespace dtr

#endif  // DTR_RUNTIME_BYTES_H_
