// Errors of the native addons (tun.cc, sockets.cc) shaped like Node's own system errors, so that
// JS code handles them the same way: `code` ('EBUSY'), `errno` (negative, as Node reports it) and
// `syscall`, with a message that says what was being done.
#pragma once

#include <napi.h>
#include <string.h>
#include <uv.h>

#include <string>

namespace mesh {

// libuv's names match Node's (err.code); errnos libuv does not know (EBADFD from a deleted device,
// say) take glibc's name instead of "Unknown system error".
inline std::string ErrnoCode(int err) {
  char buf[64];
  const char* name = uv_err_name_r(-err, buf, sizeof buf);
  if (strncmp(name, "Unknown", 7) != 0) return name;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
  const char* glibc = strerrorname_np(err);
  if (glibc != nullptr) return glibc;
#endif
  return "E" + std::to_string(err);
}

inline Napi::Error SystemError(Napi::Env env, int err, const std::string& syscall, const std::string& what) {
  std::string code = ErrnoCode(err);
  Napi::Error e = Napi::Error::New(env, what + ": " + code + " (" + strerror(err) + ")");
  e.Set("code", Napi::String::New(env, code));
  e.Set("errno", Napi::Number::New(env, -err));
  e.Set("syscall", Napi::String::New(env, syscall));
  return e;
}

}  // namespace mesh
