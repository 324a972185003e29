// Errors a user can cause (bad files, bad flags, bad ids). Every one carries a
// single-line message that names the file or input and what was wrong.
#pragma once
#include <stdexcept>
#include <string>

namespace dory {

// Control characters written as escapes (\n, \r, \t, \xNN): text taken from an input file
// (a token "\n", a GGUF key with an ESC in it) cannot break a message's one line or reach
// the terminal raw. Other bytes, UTF-8 included, are kept.
inline std::string one_line(const std::string& msg) {
  std::string out;
  out.reserve(msg.size());
  for (unsigned char c : msg) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

class Error : public std::runtime_error {
 public:
  // The message is made one line here, so that no call site has to remember to.
  explicit Error(const std::string& what) : std::runtime_error(one_line(what)) {}
};

}  // namespace dory
