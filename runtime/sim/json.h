// JSON text for the simulator tools' one-line reports (dtr-sim, dtr-chain): strings escaped as
// JSON requires, whatever bytes a trace's labels or an error message hold.
#ifndef DTR_RUNTIME_SIM_JSON_H_
#define DTR_RUNTIME_SIM_JSON_H_

#include <string>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace dtr::sim {

// `text` as a quoted JSON string: '"' and '\' escaped, control bytes as \u00XX, other bytes as
// they are (UTF-8 passes through).
inline std::string JsonString(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace dtr::sim

#endif  // DTR_RUNTIME_SIM_JSON_H_
