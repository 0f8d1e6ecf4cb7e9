// Human-readable byte counts for messages.
#include "allocator/byte_format.h"

#include "absl/strings/str_format.h"

namespace dtr::alloc {

std::string FormatBytesShort(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrFormat("%d B", bytes);
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", value, kUnits[unit]);
}

std::string FormatBytes(uint64_t bytes) {
  if (bytes < 1024) return absl::StrFormat("%d bytes", bytes);
  return absl::StrFormat("%s (%d bytes)", FormatBytesShort(bytes), bytes);
}

}  // namespace dtr::alloc
