// Errors a user can cause (bad files, bad flags, bad ids). Every one carries a
// single-line message that names the file or input and what was wrong.
#pragma once
#include <stdexcept>
#include <string>

namespace dory {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace dory
