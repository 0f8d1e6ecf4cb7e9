// Reading the simulator's text inputs (traces, chains) from a file, or from standard input when
// the path is "-", with errors that name the file.
#ifndef DTR_RUNTIME_SIM_TEXT_INPUT_H_
#define DTR_RUNTIME_SIM_TEXT_INPUT_H_

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dtr::sim {

// The whole of `path` ("-": standard input); `kind` names the input in errors ("trace").
inline absl::StatusOr<std::string> ReadTextInput(const std::string& path, absl::string_view kind) {
  std::stringstream buffer;
  if (path == "-") {
    buffer << std::cin.rdbuf();
  } else {
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", kind, " file '", path, "'"));
    buffer << in.rdbuf();
  }
  return buffer.str();
}

// Reads `path` as above and parses it with `parse` (string_view -> StatusOr<T>); parse errors are
// prefixed with the file's path (not for standard input).
template <typename Parse>
auto ParseTextInput(const std::string& path, absl::string_view kind, Parse parse)
    -> decltype(parse(absl::string_view())) {
  absl::StatusOr<std::string> text = ReadTextInput(path, kind);
  if (!text.ok()) return text.status();
  auto parsed = parse(*text);
  if (!parsed.ok() && path != "-")
    return absl::Status(parsed.status().code(), absl::StrCat(path, ": ", parsed.status().message()));
  return parsed;
}

}  // namespace dtr::sim

#endif  // DTR_RUNTIME_SIM_TEXT_INPUT_H_
