// Parsing and printing byte quantities ("6GiB", "512M", "1.5G", "123456"). Shared by the
// runtime's configuration, dtr-sim's --budget and the torch layer's DTR_BUDGET.
#ifndef DTR_RUNTIME_BYTES_H_
#define DTR_RUNTIME_BYTES_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtr {

// Accepts a non-negative number (integer or decimal) followed by an optional suffix: B, K/KB/M/MB/
// G/GB/T/TB (powers of 1000) or KiB/MiB/GiB/TiB (powers of 1024); case-insensitive except that
// "k" and "K" both mean 1000. Rejects negatives, overflow, empty input and trailing garbage.
absl::StatusOr<uint64_t> ParseBytes(absl::string_view text);

// What ParseBytes accepts, for error messages.
absl::string_view AcceptedByteForms();

// "1.50 GiB (1610612736 bytes)"-style human readable rendering.
std::string FormatBytes(uint64_t bytes);

}  // namespace dtr

#endif  // DTR_RUNTIME_BYTES_H_
