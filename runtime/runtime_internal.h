// Small helpers shared by the .cc files that implement class Runtime (runtime.cc and the files
// it names). Private to runtime/: nothing outside includes it.
#ifndef DTR_RUNTIME_RUNTIME_INTERNAL_H_
#define DTR_RUNTIME_RUNTIME_INTERNAL_H_

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/ids.h"

namespace dtr {
namespace runtime_internal {

template <typename Vec, typename T>
bool ContainsValue(const Vec& v, const T& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

inline std::string IdString(StorageId id) { return absl::StrCat("storage#", id.index, ".", id.generation); }

}  // namespace runtime_internal
}  // namespace dtr

#endif  // DTR_RUNTIME_RUNTIME_INTERNAL_H_
