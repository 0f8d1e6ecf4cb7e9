// Validation and printing of AllocatorConfig.
#include "allocator/allocator_config.h"

#include "absl/strings/str_cat.h"
#include "runtime/bytes.h"

namespace dtr::alloc {
namespace {

bool IsPowerOfTwo(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

}  // namespace

absl::Status AllocatorConfig::Validate() const {
  if (budget_bytes == 0) return absl::InvalidArgumentError("budget_bytes must be > 0");
  if (!IsPowerOfTwo(min_block_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_block_size must be a power of two, got ", min_block_size));
  }
  auto multiple = [&](size_t v) { return v % min_block_size == 0; };
  if (small_size == 0 || !multiple(small_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "small_size must be a positive multiple of min_block_size, got ", small_size));
  }
  if (small_segment_size < small_size || !multiple(small_segment_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("small_segment_size must be >= small_size and a multiple of min_block_size, "
                     "got ",
                     small_segment_size));
  }
  if (min_large_alloc <= small_size) {
    return absl::InvalidArgumentError(absl::StrCat("min_large_alloc (", min_large_alloc,
                                                   ") must exceed small_size (", small_size, ")"));
  }
  if (large_segment_size < min_large_alloc || !multiple(large_segment_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "large_segment_size must be >= min_large_alloc and a multiple of min_block_size, got ",
        large_segment_size));
  }
  if (large_round == 0 || !multiple(large_round)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "large_round must be a positive multiple of min_block_size, got ", large_round));
  }
  return absl::OkStatus();
}

std::string AllocatorConfig::ToString() const {
  return absl::StrCat(
      "AllocatorConfig{budget=", unlimited_budget() ? "unlimited" : FormatBytes(budget_bytes),
      ", min_block=", FormatBytesShort(min_block_size),
      ", small_size=", FormatBytesShort(small_size),
      ", small_segment=", FormatBytesShort(small_segment_size),
      ", large_segment=", FormatBytesShort(large_segment_size),
      ", min_large_alloc=", FormatBytesShort(min_large_alloc),
      ", large_round=", FormatBytesShort(large_round),
      ", eviction=", enable_eviction ? "on" : "off",
      ", shrink_segment_to_fit_budget=", shrink_segment_to_fit_budget ? "on" : "off",
      ", exact_reuse=", exact_reuse ? "on" : "off", "}");
}

bool operator==(const AllocatorConfig& a, const AllocatorConfig& b) {
  return a.budget_bytes == b.budget_bytes && a.min_block_size == b.min_block_size &&
         a.small_size == b.small_size && a.small_segment_size == b.small_segment_size &&
         a.large_segment_size == b.large_segment_size && a.min_large_alloc == b.min_large_alloc &&
         a.large_round == b.large_round && a.enable_eviction == b.enable_eviction &&
         a.shrink_segment_to_fit_budget == b.shrink_segment_to_fit_budget &&
         a.exact_reuse == b.exact_reuse;
}

}  // namespace dtr::alloc
