// Byte quantity parsing; see bytes.h.
#include "runtime/bytes.h"

#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dtr {

absl::string_view AcceptedByteForms() {
  return "a byte count such as 1073741824, or a number with a suffix: K, M, G, T (powers of 1000, "
         "also KB/MB/GB/TB) or KiB, MiB, GiB, TiB (powers of 1024), e.g. 6GiB, 512M, 1.5G";
}

absl::StatusOr<uint64_t> ParseBytes(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  size_t split = 0;
  while (split < s.size() && (absl::ascii_isdigit(s[split]) || s[split] == '.')) ++split;
  absl::string_view number = s.substr(0, split);
  std::string suffix = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s.substr(split)));
  auto error = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid byte quantity '", text, "' (", why, "); expected ", AcceptedByteForms()));
  };
  if (number.empty()) return error("no number");
  double value = 0;
  if (!absl::SimpleAtod(number, &value) || !std::isfinite(value)) return error("not a number");
  double scale = 1;
  if (suffix.empty() || suffix == "b") scale = 1;
  else if (suffix == "k" || suffix == "kb") scale = 1e3;
  else if (suffix == "m" || suffix == "mb") scale = 1e6;
  else if (suffix == "g" || suffix == "gb") scale = 1e9;
  else if (suffix == "t" || suffix == "tb") scale = 1e12;
  else if (suffix == "kib") scale = 1024.0;
  else if (suffix == "mib") scale = 1024.0 * 1024;
  else if (suffix == "gib") scale = 1024.0 * 1024 * 1024;
  else if (suffix == "tib") scale = 1024.0 * 1024 * 1024 * 1024;
  else return error(absl::StrCat("unknown suffix '", suffix, "'"));
  double bytes = value * scale;
  // Beyond 2^60 (1 EiB) no machine has the memory, and doubles lose whole bytes (an int64 max
  // once rounded to 2^63 and wrapped to a negative budget).
  if (bytes > double(kMaxByteQuantity)) return error("more than 1 EiB; for no cap use 'unlimited'");
  if (scale == 1 && number.find('.') == absl::string_view::npos) {
    uint64_t exact = 0;
    if (!absl::SimpleAtoi(number, &exact) || exact > kMaxByteQuantity) return error("more than 1 EiB; for no cap use 'unlimited'");
    return exact;
  }
  if (scale == 1 && number.find('.') != absl::string_view::npos && value != std::floor(value))
    return error("fractional byte count");
  return uint64_t(std::llround(std::floor(bytes)));
}

std::string FormatBytesShort(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = double(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 6) {
    v /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", v, kUnits[unit]);
}

std::string FormatBytes(uint64_t bytes) {
  if (bytes < 1024) return FormatBytesShort(bytes);
  return absl::StrFormat("%s (%d bytes)", FormatBytesShort(bytes), bytes);
}

}  // namespace dtr
