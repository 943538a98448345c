/*
 * mesh_exec: execv(), which Node 20 cannot reach (Node 22.15+ has an experimental process.execve;
 * src/native/exec.ts uses this addon on every version).
 *
 * The agent uses it once, at start, to restart itself in place with the V8 flags it needs and that
 * NODE_OPTIONS refuses (src/cli/v8-flags.ts): the process keeps its pid, its network namespace, its
 * stdio and its environment, so systemd, `ip netns exec` and a supervisor's kill -9 see one process.
 *
 * Only src/native/exec.ts loads this addon.
 *
 * JS surface:
 *   execv(path, argv[]) -> never returns on success; throws a system error (code ENOENT, EACCES, ...)
 */
#include <napi.h>

#include "system-error.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace {

Napi::Value Execv(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() != 2 || !info[0].IsString() || !info[1].IsArray()) {
    Napi::TypeError::New(env, "execv(path: string, argv: string[])").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  std::string path = info[0].As<Napi::String>();
  Napi::Array list = info[1].As<Napi::Array>();
  std::vector<std::string> args;
  for (uint32_t i = 0; i < list.Length(); i++) {
    Napi::Value v = list.Get(i);
    if (!v.IsString()) {
      Napi::TypeError::New(env, "execv: argv must hold strings").ThrowAsJavaScriptException();
      return env.Undefined();
    }
    args.push_back(v.As<Napi::String>());
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Node marks stdin, stdout and stderr close-on-exec at start-up (so its children do not inherit
  // them by accident); the process that replaces it must keep them, or its output goes nowhere.
  for (int fd = 0; fd <= 2; fd++) {
    int flags = fcntl(fd, F_GETFD);
    if (flags != -1 && (flags & FD_CLOEXEC)) fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC);
  }
  // environ is current: Node writes process.env changes through to it (setenv).
  execv(path.c_str(), argv.data());
  mesh::SystemError(env, errno, "execv", "cannot restart " + path).ThrowAsJavaScriptException();
  return env.Undefined();
}

}  // namespace

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("execv", Napi::Function::New(env, Execv));
  return exports;
}

NODE_API_MODULE(mesh_exec, Init)
