// distkit/error.hpp - exception types that cross into Python as specific exceptions.
//
// Every native module registers these with distkit::register_exceptions() (see
// distkit/pybind.hpp); the mapping is:
//   ValueError   -> ValueError        TypeError -> TypeError
//   IndexError   -> IndexError        OSError   -> OSError (errno kept)
//   MPIError     -> RuntimeError      CudaError -> RuntimeError
//   Error        -> RuntimeError
#pragma once

#include <cerrno>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace distkit {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};
class ValueError : public Error {
 public:
  using Error::Error;
};
class TypeError : public Error {
 public:
  using Error::Error;
};
class IndexError : public Error {
 public:
  using Error::Error;
};
class MPIError : public Error {
 public:
  MPIError(const std::string& msg, int code) : Error(msg), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};
class CudaError : public Error {
 public:
  using Error::Error;
};
class OSError : public Error {
 public:
  OSError(const std::string& msg, int err) : Error(msg + ": " + std::strerror(err)), errno_(err) {}
  int error_number() const noexcept { return errno_; }

 private:
  int errno_;
};

namespace detail {
inline void append(std::ostringstream&) {}
template <class T, class... Rest>
void append(std::ostringstream& os, T&& v, Rest&&... rest) {
  os << std::forward<T>(v);
  append(os, std::forward<Rest>(rest)...);
}
}  // namespace detail

/// Concatenate any streamable values into a message.
template <class... Args>
std::string str(Args&&... args) {
  std::ostringstream os;
  detail::append(os, std::forward<Args>(args)...);
  return os.str();
}

/// Throw E with a message built from args when cond is false.
template <class E = ValueError, class... Args>
inline void check(bool cond, Args&&... args) {
  if (!cond) throw E(str(std::forward<Args>(args)...));
}

/// Throw OSError(errno) when a POSIX call returned -1.
inline void check_errno(long rc, const std::string& what) {
  if (rc == -1) throw OSError(what, errno);
}

}  // namespace distkit
