// Status: errors are values. A Status is either OK or carries an errno-style code and a message
// that names what failed and, where the user can act, which option or condition to fix.
// Never thrown; cheap to return when OK (no allocation).
#pragma once

#include <cerrno>
#include <string>
#include <utility>

namespace zrtier {

class Status {
 public:
  Status() = default;  // OK
  static Status Ok() { return Status(); }
  // `code` is a positive errno value (EINVAL, ENOMEM, ENOSPC, EIO, ENOSYS, ...).
  static Status Error(int code, std::string message) { return Status(code, std::move(message)); }

  bool ok() const { return code_ == 0; }
  int code() const { return code_; }
  const std::string& message() const { return message_; }
  // "OK" or "<strerror(code)>: <message>".
  std::string ToString() const;

 private:
  Status(int code, std::string message) : code_(code ? code : EIO), message_(std::move(message)) {}
  int code_ = 0;
  std::string message_;
};

// Returns from the enclosing function if `expr` yields a non-OK Status.
#define ZRTIER_RETURN_IF_ERROR(expr)         \
  do {                                       \
    ::zrtier::Status _zr_status = (expr);    \
    if (!_zr_status.ok()) return _zr_status; \
  } while (0)

}  // namespace zrtier
