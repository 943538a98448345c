/*
 * mesh_netlink: the kernel's own answers without a process per question. Node cannot open an
 * AF_NETLINK socket, and starting `ip` or `nft` costs more than the 50 ms explain may take on a
 * loaded host (docs/architecture.md, "Reading the kernel"). This addon only moves bytes: the
 * requests are built and the replies parsed in TypeScript (src/dataplane/kernel/rtnetlink.ts).
 *
 * Only src/native/netlink.ts loads this addon.
 *
 * JS surface (both synchronous: rtnetlink answers a request within the sending call, and a
 * listing of the agent's nftables table is one small netlink dump):
 *   request(protocol, message: Buffer, netnsPath?: string) -> Buffer
 *     sends one netlink message on a fresh socket (made inside netnsPath's namespace when given)
 *     and returns every reply message, up to NLMSG_DONE or an NLMSG_ERROR (dump), or the first
 *     reply (anything else). Throws a system error when the socket cannot be made or stays silent
 *     for 2 s.
 *   nftList(command: string, netnsPath?: string) -> { code, output, error }
 *     runs one nft command through libnftables (the library the nft tool is made of, loaded at
 *     the first call), with the tool's default output; code is nft's exit status. Throws when
 *     libnftables cannot be loaded.
 */
#include <napi.h>

#include "system-error.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace {

// Runs the enclosed code in another network namespace, on this thread only, and returns. A
// failure to return is fatal: everything after would read and change the wrong namespace.
class InNetns {
 public:
  explicit InNetns(const std::string& path) {
    if (path.empty()) return;
    original_ = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (original_ < 0) {
      error_ = errno;
      return;
    }
    int target = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (target < 0 || setns(target, CLONE_NEWNET) != 0) {
      error_ = errno;
      if (target >= 0) close(target);
      close(original_);
      original_ = -1;
      return;
    }
    close(target);
  }
  ~InNetns() {
    if (original_ < 0) return;
    if (setns(original_, CLONE_NEWNET) != 0) abort();
    close(original_);
  }
  int error() const { return error_; }

 private:
  int original_ = -1;
  int error_ = 0;
};

std::string OptionalString(const Napi::CallbackInfo& info, size_t i) {
  return info.Length() > i && info[i].IsString() ? info[i].As<Napi::String>().Utf8Value() : "";
}

Napi::Value Request(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[0].IsNumber() || !info[1].IsBuffer()) {
    Napi::TypeError::New(env, "request(protocol: number, message: Buffer, netnsPath?: string)")
        .ThrowAsJavaScriptException();
    return env.Undefined();
  }
  int protocol = info[0].As<Napi::Number>().Int32Value();
  Napi::Buffer<uint8_t> message = info[1].As<Napi::Buffer<uint8_t>>();
  if (message.Length() < sizeof(nlmsghdr)) {
    Napi::TypeError::New(env, "request: the message is shorter than its header").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  std::string netns = OptionalString(info, 2);
  int fd;
  {
    InNetns in(netns);
    if (in.error() != 0) {
      mesh::SystemError(env, in.error(), "setns", "netlink: entering " + netns).ThrowAsJavaScriptException();
      return env.Undefined();
    }
    fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, protocol);
  }
  if (fd < 0) {
    mesh::SystemError(env, errno, "socket", "netlink socket").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  timeval timeout{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (sendto(fd, message.Data(), message.Length(), 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0) {
    int err = errno;
    close(fd);
    mesh::SystemError(env, err, "sendto", "netlink request").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  const bool dump = (reinterpret_cast<const nlmsghdr*>(message.Data())->nlmsg_flags & NLM_F_DUMP) == NLM_F_DUMP;
  std::vector<uint8_t> out;
  std::vector<uint8_t> buf(1 << 16);
  for (bool done = false; !done;) {
    // MSG_PEEK | MSG_TRUNC first: a message larger than the buffer grows it rather than being cut.
    ssize_t size = recv(fd, buf.data(), buf.size(), MSG_PEEK | MSG_TRUNC);
    if (size > static_cast<ssize_t>(buf.size())) buf.resize(size);
    ssize_t n = size < 0 ? size : recv(fd, buf.data(), buf.size(), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      close(fd);
      mesh::SystemError(env, err, "recv", "netlink reply").ThrowAsJavaScriptException();
      return env.Undefined();
    }
    int left = static_cast<int>(n);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf.data()); NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
      if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) done = true;
    }
    out.insert(out.end(), buf.begin(), buf.begin() + n);
    if (!dump) done = true;
  }
  close(fd);
  return Napi::Buffer<uint8_t>::Copy(env, out.data(), out.size());
}

// The part of libnftables' API used here (libnftables(3)); resolved at the first call.
struct Nftables {
  void* (*ctxNew)(uint32_t);
  void (*ctxFree)(void*);
  int (*bufferOutput)(void*);
  int (*bufferError)(void*);
  int (*run)(void*, const char*);
  const char* (*output)(void*);
  const char* (*error)(void*);
};

const Nftables* LoadNftables(std::string* why) {
  static Nftables api{};
  static bool loaded = false;
  if (loaded) return &api;
  void* lib = dlopen("libnftables.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    *why = dlerror();
    return nullptr;
  }
  api.ctxNew = reinterpret_cast<void* (*)(uint32_t)>(dlsym(lib, "nft_ctx_new"));
  api.ctxFree = reinterpret_cast<void (*)(void*)>(dlsym(lib, "nft_ctx_free"));
  api.bufferOutput = reinterpret_cast<int (*)(void*)>(dlsym(lib, "nft_ctx_buffer_output"));
  api.bufferError = reinterpret_cast<int (*)(void*)>(dlsym(lib, "nft_ctx_buffer_error"));
  api.run = reinterpret_cast<int (*)(void*, const char*)>(dlsym(lib, "nft_run_cmd_from_buffer"));
  api.output = reinterpret_cast<const char* (*)(void*)>(dlsym(lib, "nft_ctx_get_output_buffer"));
  api.error = reinterpret_cast<const char* (*)(void*)>(dlsym(lib, "nft_ctx_get_error_buffer"));
  if (!api.ctxNew || !api.ctxFree || !api.bufferOutput || !api.bufferError || !api.run || !api.output ||
      !api.error) {
    *why = "libnftables.so.1 lacks the nft_ctx_* functions";
    return nullptr;
  }
  loaded = true;
  return &api;
}

Napi::Value NftList(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString()) {
    Napi::TypeError::New(env, "nftList(command: string, netnsPath?: string)").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  std::string why;
  const Nftables* nft = LoadNftables(&why);
  if (nft == nullptr) {
    Napi::Error::New(env, "cannot load libnftables: " + why).ThrowAsJavaScriptException();
    return env.Undefined();
  }
  std::string command = info[0].As<Napi::String>();
  std::string netns = OptionalString(info, 1);
  Napi::Object result = Napi::Object::New(env);
  InNetns in(netns);
  if (in.error() != 0) {
    mesh::SystemError(env, in.error(), "setns", "nft: entering " + netns).ThrowAsJavaScriptException();
    return env.Undefined();
  }
  // A context per call: nothing of one reading is kept for the next (NFT_CTX_DEFAULT is 0).
  void* ctx = nft->ctxNew(0);
  if (ctx == nullptr) {
    Napi::Error::New(env, "nft_ctx_new failed").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  nft->bufferOutput(ctx);
  nft->bufferError(ctx);
  int rc = nft->run(ctx, command.c_str());
  const char* output = nft->output(ctx);
  const char* error = nft->error(ctx);
  result.Set("code", Napi::Number::New(env, rc == 0 ? 0 : 1));
  result.Set("output", Napi::String::New(env, output ? output : ""));
  result.Set("error", Napi::String::New(env, error ? error : ""));
  nft->ctxFree(ctx);
  return result;
}

}  // namespace

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("request", Napi::Function::New(env, Request));
  exports.Set("nftList", Napi::Function::New(env, NftList));
  return exports;
}

NODE_API_MODULE(mesh_netlink, Init)
