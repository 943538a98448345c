/*
 * mesh_sockets: the TCP sockets the data plane needs and Node's net module cannot make (the stream
 * path and fully transparent services: docs/dataplane.md, docs/transparent.md).
 * - a listening socket with IP_TRANSPARENT / IPV6_TRANSPARENT, so that connections nftables TPROXYs to it
 *   are accepted with their ORIGINAL destination as the local address;
 * - an outgoing connection with options that must be set before bind()/connect(): SO_MARK (policy routing
 *   of the agent's own traffic), IP_TRANSPARENT (a non-local source address, the original client's).
 * Both hand a plain non-blocking fd to JavaScript, which wraps it in net.Server / net.Socket: reading and
 * writing are Node's own. The non-blocking connect is driven by the event loop (uv_poll for writable, a
 * uv_timer for the deadline): no thread and no libuv thread pool is involved.
 *
 * Only src/native/sockets.ts loads this addon; everything else goes through that wrapper.
 *
 * JS surface:
 *   openTransparentListener(family 4|6, address | null, port, backlog) -> fd      throws a system error
 *   new Connect(family, address, port, localAddress | null, localPort, transparent, mark (-1: none),
 *               timeoutMs (0: none), onDone(err | null, fd))                     throws a system error
 *     onDone is called exactly once unless cancel() came first; the fd is then the caller's. Either way
 *     the addon lets go of onDone then, so nothing of the connect outlives it.
 *   Connect#cancel() -> boolean   closes the pending socket, onDone is not called; false when already done
 */
#include <napi.h>

#include "system-error.h"

#ifdef __linux__

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <memory>
#include <string>

namespace {

using mesh::SystemError;

struct Failure {
  int err = 0;
  std::string syscall;
};

struct SockAddr {
  sockaddr_storage storage;
  socklen_t length = 0;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

// An empty address is the wildcard. False when `ip` is not an address of that family.
bool MakeAddr(int family, const std::string& ip, int port, SockAddr* out) {
  memset(&out->storage, 0, sizeof out->storage);
  if (family == 4) {
    auto* sin = reinterpret_cast<sockaddr_in*>(&out->storage);
    sin->sin_family = AF_INET;
    sin->sin_port = htons(static_cast<uint16_t>(port));
    sin->sin_addr.s_addr = htonl(INADDR_ANY);
    if (!ip.empty() && inet_pton(AF_INET, ip.c_str(), &sin->sin_addr) != 1) return false;
    out->length = sizeof *sin;
  } else {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&out->storage);
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = htons(static_cast<uint16_t>(port));
    sin6->sin6_addr = in6addr_any;
    if (!ip.empty() && inet_pton(AF_INET6, ip.c_str(), &sin6->sin6_addr) != 1) return false;
    out->length = sizeof *sin6;
  }
  return true;
}

bool SetInt(int fd, int level, int name, int value, const char* syscall, Failure* fail) {
  if (setsockopt(fd, level, name, &value, sizeof value) == 0) return true;
  *fail = {errno, syscall};
  return false;
}

// IP_TRANSPARENT lets a socket bind to an address that is not local and, on a listener, accept the
// connections TPROXY diverts to it (the kernel then reports their original destination as the local
// address). Needs CAP_NET_ADMIN (or CAP_NET_RAW).
bool SetTransparent(int fd, int family, Failure* fail) {
  if (family == 4) return SetInt(fd, IPPROTO_IP, IP_TRANSPARENT, 1, "setsockopt(IP_TRANSPARENT)", fail);
  return SetInt(fd, IPPROTO_IPV6, IPV6_TRANSPARENT, 1, "setsockopt(IPV6_TRANSPARENT)", fail);
}

bool ReadFamily(const Napi::Value& v, int* family) {
  if (!v.IsNumber()) return false;
  *family = v.As<Napi::Number>().Int32Value();
  return *family == 4 || *family == 6;
}

bool ReadPort(const Napi::Value& v, int* port) {
  if (!v.IsNumber()) return false;
  double d = v.As<Napi::Number>().DoubleValue();
  if (!(d >= 0 && d <= 65535) || d != static_cast<int>(d)) return false;
  *port = static_cast<int>(d);
  return true;
}

std::string Endpoint(int family, const std::string& ip, int port) {
  std::string host = ip.empty() ? (family == 4 ? "0.0.0.0" : "::") : ip;
  return family == 6 ? "[" + host + "]:" + std::to_string(port) : host + ":" + std::to_string(port);
}

Napi::Value OpenTransparentListener(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int family = 0, port = 0;
  if (info.Length() < 4 || !ReadFamily(info[0], &family) || !(info[1].IsString() || info[1].IsNull()) ||
      !ReadPort(info[2], &port) || !info[3].IsNumber()) {
    Napi::TypeError::New(env, "openTransparentListener(family 4|6, address|null, port 0..65535, backlog)")
        .ThrowAsJavaScriptException();
    return Napi::Value();
  }
  std::string ip = info[1].IsString() ? info[1].As<Napi::String>().Utf8Value() : "";
  int backlog = info[3].As<Napi::Number>().Int32Value();
  // Optional 5th argument: SO_MARK of the listener, inherited by every accepted socket, so that
  // policy routing can tell the agent's own replies to intercepted clients from others' traffic.
  double mark = info.Length() > 4 && info[4].IsNumber() ? info[4].As<Napi::Number>().DoubleValue() : -1;
  if (!(mark >= -1 && mark <= 4294967295.0)) {
    Napi::RangeError::New(env, "mark must be -1 (none) or 0..2^32-1").ThrowAsJavaScriptException();
    return Napi::Value();
  }
  SockAddr addr;
  if (!MakeAddr(family, ip, port, &addr)) {
    Napi::TypeError::New(env, "not an IPv" + std::to_string(family) + " address: '" + ip + "'")
        .ThrowAsJavaScriptException();
    return Napi::Value();
  }
  std::string where = "transparent listener on " + Endpoint(family, ip, port);

  int fd = socket(family == 4 ? AF_INET : AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    SystemError(env, errno, "socket", "cannot open a " + where).ThrowAsJavaScriptException();
    return Napi::Value();
  }
  Failure fail;
  // SO_REUSEADDR: an agent restarting while its previous connections sit in TIME_WAIT can listen again.
  // IPV6_V6ONLY: the IPv4 listener on the same port is a socket of its own (and a v4-mapped TPROXY
  // delivery to the v6 one would report mapped addresses).
  bool ok = SetInt(fd, SOL_SOCKET, SO_REUSEADDR, 1, "setsockopt(SO_REUSEADDR)", &fail) &&
            (family == 4 || SetInt(fd, IPPROTO_IPV6, IPV6_V6ONLY, 1, "setsockopt(IPV6_V6ONLY)", &fail)) &&
            SetTransparent(fd, family, &fail);
  if (ok && mark >= 0) {
    uint32_t m = static_cast<uint32_t>(mark);
    if (setsockopt(fd, SOL_SOCKET, SO_MARK, &m, sizeof m) != 0) {
      fail = {errno, "setsockopt(SO_MARK)"};
      ok = false;
    }
  }
  if (ok && bind(fd, addr.get(), addr.length) != 0) {
    fail = {errno, "bind"};
    ok = false;
  }
  if (ok && listen(fd, backlog) != 0) {
    fail = {errno, "listen"};
    ok = false;
  }
  if (!ok) {
    close(fd);
    SystemError(env, fail.err, fail.syscall, "cannot open a " + where).ThrowAsJavaScriptException();
    return Napi::Value();
  }
  return Napi::Number::New(env, fd);
}

class Connect;

// The libuv side of one connect: the socket, a poll handle (writable = connected or failed) and a timer
// (the deadline). It lives on the heap apart from the JS object because the handles' close callbacks may
// run after that object is gone. An async cleanup hook stays registered until both handles have finished
// closing: a worker (or the process) torn down mid-connect then closes the socket and its handles, and
// Node waits for the close callbacks before it unloads this addon (code that a late callback would jump
// into otherwise: a segfault).
struct Pending {
  uv_poll_t poll;
  uv_timer_t timer;
  int fd = -1;
  int handles = 0;  // initialised handles whose close callback has not run yet
  bool closing = false;
  bool timedOut = false;
  napi_async_cleanup_hook_handle hook = nullptr;
  Connect* owner = nullptr;  // null once the JS side is done with it
};

void OnHandleClosed(uv_handle_t* h) {
  auto* p = static_cast<Pending*>(h->data);
  if (--p->handles > 0) return;
  // Unregisters the hook, or (when Node is tearing the environment down) reports it done.
  if (p->hook != nullptr) napi_remove_async_cleanup_hook(p->hook);
  delete p;
}

void CloseHandles(Pending* p) {
  if (p->closing) return;
  p->closing = true;
  uv_close(reinterpret_cast<uv_handle_t*>(&p->poll), OnHandleClosed);
  uv_close(reinterpret_cast<uv_handle_t*>(&p->timer), OnHandleClosed);
}

// One non-blocking connect in progress. The JS object is held (Ref) until it settles or is cancelled.
class Connect : public Napi::ObjectWrap<Connect> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "Connect", {InstanceMethod<&Connect::Cancel>("cancel")});
  }

  explicit Connect(const Napi::CallbackInfo& info) : Napi::ObjectWrap<Connect>(info) {
    Napi::Env env = info.Env();
    int family = 0, port = 0, localPort = 0;
    if (info.Length() < 9 || !ReadFamily(info[0], &family) || !info[1].IsString() || !ReadPort(info[2], &port) ||
        !(info[3].IsString() || info[3].IsNull()) || !ReadPort(info[4], &localPort) || !info[5].IsBoolean() ||
        !info[6].IsNumber() || !info[7].IsNumber() || !info[8].IsFunction()) {
      Napi::TypeError::New(env,
                           "Connect(family 4|6, address, port, localAddress|null, localPort, transparent, "
                           "mark|-1, timeoutMs, onDone)")
          .ThrowAsJavaScriptException();
      return;
    }
    std::string ip = info[1].As<Napi::String>().Utf8Value();
    std::string localIp = info[3].IsString() ? info[3].As<Napi::String>().Utf8Value() : "";
    bool transparent = info[5].As<Napi::Boolean>().Value();
    double mark = info[6].As<Napi::Number>().DoubleValue();
    double timeoutMs = info[7].As<Napi::Number>().DoubleValue();
    if (!(mark >= -1 && mark <= 4294967295.0) || !(timeoutMs >= 0 && timeoutMs <= 4294967295.0)) {
      Napi::RangeError::New(env, "mark must be -1 (none) or 0..2^32-1, timeoutMs 0..2^32-1")
          .ThrowAsJavaScriptException();
      return;
    }
    SockAddr remote, local;
    if (ip.empty() || !MakeAddr(family, ip, port, &remote) || !MakeAddr(family, localIp, localPort, &local)) {
      Napi::TypeError::New(env, "not IPv" + std::to_string(family) + " addresses: '" + ip + "', '" + localIp + "'")
          .ThrowAsJavaScriptException();
      return;
    }
    target_ = Endpoint(family, ip, port);
    uv_loop_t* loop = nullptr;
    if (napi_get_uv_event_loop(env, &loop) != napi_ok || loop == nullptr) {
      Napi::Error::New(env, "no event loop").ThrowAsJavaScriptException();
      return;
    }

    int fd = socket(family == 4 ? AF_INET : AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      SystemError(env, errno, "socket", "cannot connect to " + target_).ThrowAsJavaScriptException();
      return;
    }
    Failure fail;
    bool ok = true;
    // Before connect: the mark decides the route of the SYN already. Needs CAP_NET_ADMIN.
    if (mark >= 0) {
      uint32_t m = static_cast<uint32_t>(mark);
      if (setsockopt(fd, SOL_SOCKET, SO_MARK, &m, sizeof m) != 0) {
        fail = {errno, "setsockopt(SO_MARK)"};
        ok = false;
      }
    }
    // Before bind: binding a non-local address is what IP_TRANSPARENT allows.
    if (ok && transparent) ok = SetTransparent(fd, family, &fail);
    if (ok && (!localIp.empty() || localPort != 0)) {
      // An address without a port: the port is picked at connect() for the whole 4-tuple, so many
      // connections from one source address do not each need a port of their own.
      if (localPort == 0 && !SetInt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1,
                                    "setsockopt(IP_BIND_ADDRESS_NO_PORT)", &fail))
        ok = false;
      if (ok && bind(fd, local.get(), local.length) != 0) {
        fail = {errno, "bind"};
        ok = false;
      }
    }
    if (ok && connect(fd, remote.get(), remote.length) != 0 && errno != EINPROGRESS) {
      fail = {errno, "connect"};
      ok = false;
    }
    if (!ok) {
      close(fd);
      std::string what = fail.syscall == "bind" ? "cannot bind to " + Endpoint(family, localIp, localPort) +
                                                      " to connect to " + target_
                                                : "cannot connect to " + target_;
      SystemError(env, fail.err, fail.syscall, what).ThrowAsJavaScriptException();
      return;
    }

    auto* p = new Pending;
    int rc = uv_poll_init(loop, &p->poll, fd);
    if (rc != 0) {
      delete p;  // uv_poll_init leaves nothing registered when it fails
      close(fd);
      SystemError(env, -rc, "uv_poll_init", "cannot wait for the connection to " + target_)
          .ThrowAsJavaScriptException();
      return;
    }
    uv_timer_init(loop, &p->timer);  // cannot fail
    p->poll.data = p;
    p->timer.data = p;
    p->handles = 2;
    p->fd = fd;
    p->owner = this;
    pending_ = p;
    if (napi_add_async_cleanup_hook(env, OnEnvCleanup, p, &p->hook) != napi_ok) p->hook = nullptr;
    // Writable means connected or failed (EPOLLERR/EPOLLHUP are reported as writable): SO_ERROR says which.
    // A connect() that completed at once is writable at once too, so success is always reported later,
    // from the loop, never from inside this constructor.
    rc = uv_poll_start(&p->poll, UV_WRITABLE, OnWritable);
    if (rc != 0) {
      Release();
      SystemError(env, -rc, "uv_poll_start", "cannot wait for the connection to " + target_)
          .ThrowAsJavaScriptException();
      return;
    }
    if (timeoutMs > 0) {
      timeoutMs_ = static_cast<uint64_t>(timeoutMs);
      uv_timer_start(&p->timer, OnTimeout, timeoutMs_, 0);
    }
    onDone_ = Napi::Persistent(info[8].As<Napi::Function>());
    context_ = std::make_unique<Napi::AsyncContext>(env, "MeshConnect", Napi::Object::New(env));
    // Pending connects live until they settle, like a net.Socket that is connecting.
    Ref();
  }

  ~Connect() override { Release(); }

 private:
  static void OnWritable(uv_poll_t* handle, int status, int events) {
    auto* p = static_cast<Pending*>(handle->data);
    if (p->owner == nullptr || p->fd < 0) return;
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err == 0 && status < 0) err = -status;
    p->owner->Settle(err);
  }

  static void OnTimeout(uv_timer_t* handle) {
    auto* p = static_cast<Pending*>(handle->data);
    if (p->owner == nullptr || p->fd < 0) return;
    p->timedOut = true;
    p->owner->Settle(ETIMEDOUT);
  }

  // The environment goes away with the connect pending: nobody will take the socket.
  static void OnEnvCleanup(napi_async_cleanup_hook_handle handle, void* arg) {
    auto* p = static_cast<Pending*>(arg);
    if (p->owner != nullptr) p->owner->pending_ = nullptr;
    p->owner = nullptr;
    if (p->fd >= 0) close(p->fd);
    p->fd = -1;
    CloseHandles(p);  // OnHandleClosed reports the hook done (at once if already closing: it is waited for)
  }

  Napi::Value Cancel(const Napi::CallbackInfo& info) {
    bool pending = pending_ != nullptr && pending_->fd >= 0;
    if (pending) {
      Release();
      DropCallback();
      Unref();
    }
    return Napi::Boolean::New(info.Env(), pending);
  }

  // The callback is a strong reference from outside the JS heap, and its closure usually holds this
  // object (to cancel it): kept after the connect is over, it would keep both alive for good.
  void DropCallback() {
    onDone_.Reset();
    context_.reset();
  }

  // Reports the outcome once: the fd goes to JS on success, is closed on failure. With raw N-API calls
  // whose refusals are handled: in a worker being terminated JS no longer runs, calls that would run it
  // are refused, and node-addon-api answers a refused call with a fatal error of the whole process.
  // Then nobody can take the outcome: the socket is closed and the callback dropped.
  void Settle(int err) {
    napi_env env = Env();
    bool timedOut = pending_->timedOut;
    int fd = Detach();
    if (err != 0) {
      close(fd);
      fd = -1;
    }
    Napi::FunctionReference onDone = std::move(onDone_);
    std::unique_ptr<Napi::AsyncContext> context = std::move(context_);
    bool delivered = false;
    napi_handle_scope scope;
    if (napi_open_handle_scope(env, &scope) == napi_ok) {
      // Read before Unref(): the wrapper stays alive in this scope while JS runs.
      napi_value self = Value();
      Unref();
      napi_value args[2];
      bool ready;
      if (err == 0) {
        ready = napi_get_null(env, &args[0]) == napi_ok && napi_create_int32(env, fd, &args[1]) == napi_ok;
      } else {
        std::string what = "connect to " + target_ +
                           (timedOut ? " timed out after " + std::to_string(timeoutMs_) + " ms" : " failed");
        args[0] = ErrorOrNull(env, err, "connect", what);
        ready = args[0] != nullptr && napi_get_undefined(env, &args[1]) == napi_ok;
      }
      if (ready) delivered = Call(env, self, onDone.Value(), *context, args);
      napi_close_handle_scope(env, scope);
    } else {
      Unref();
    }
    if (!delivered && fd >= 0) close(fd);
  }

  // Runs the callback; false if N-API refused to (JS no longer runs). A callback that throws is an
  // uncaught exception of the process, as for Node's own callbacks.
  static bool Call(napi_env env, napi_value self, napi_value fn, napi_async_context context, napi_value* args) {
    napi_value result;
    if (napi_make_callback(env, context, self, fn, 2, args, &result) == napi_ok) return true;
    bool pending = false;
    if (napi_is_exception_pending(env, &pending) != napi_ok || !pending) return false;
    napi_value e;
    if (napi_get_and_clear_last_exception(env, &e) == napi_ok) napi_fatal_exception(env, e);
    return true;
  }

  // mesh::SystemError without node-addon-api: the Error, or nullptr when N-API refuses.
  static napi_value ErrorOrNull(napi_env env, int err, const std::string& syscall, const std::string& what) {
    std::string code = mesh::ErrnoCode(err);
    std::string message = what + ": " + code + " (" + strerror(err) + ")";
    napi_value text, error, codeValue, errnoValue, syscallValue;
    bool ok = napi_create_string_utf8(env, message.c_str(), message.size(), &text) == napi_ok &&
              napi_create_error(env, nullptr, text, &error) == napi_ok &&
              napi_create_string_utf8(env, code.c_str(), code.size(), &codeValue) == napi_ok &&
              napi_create_int32(env, -err, &errnoValue) == napi_ok &&
              napi_create_string_utf8(env, syscall.c_str(), syscall.size(), &syscallValue) == napi_ok &&
              napi_set_named_property(env, error, "code", codeValue) == napi_ok &&
              napi_set_named_property(env, error, "errno", errnoValue) == napi_ok &&
              napi_set_named_property(env, error, "syscall", syscallValue) == napi_ok;
    return ok ? error : nullptr;
  }

  // Closes both handles and hands back the fd, still open. uv_close() of a poll handle takes the fd out
  // of epoll right away (only the memory is freed later), so Node may register the same fd in the same
  // loop as soon as this returns.
  int Detach() {
    Pending* p = pending_;
    if (p == nullptr) return -1;
    pending_ = nullptr;
    p->owner = nullptr;
    int fd = p->fd;
    p->fd = -1;
    CloseHandles(p);
    return fd;
  }

  void Release() {
    int fd = Detach();
    if (fd >= 0) close(fd);
  }

  Pending* pending_ = nullptr;
  uint64_t timeoutMs_ = 0;
  std::string target_;
  Napi::FunctionReference onDone_;
  std::unique_ptr<Napi::AsyncContext> context_;
};

// Sets an int socket option of a connected socket from (fd, bytes) and returns what the kernel
// holds afterwards (getsockopt): the two byte-count options below, which Node cannot set.
Napi::Value SetByteOption(const Napi::CallbackInfo& info, int level, int option, const char* usage,
                          const char* failure) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[0].IsNumber() || !info[1].IsNumber()) {
    Napi::TypeError::New(env, usage).ThrowAsJavaScriptException();
    return Napi::Value();
  }
  int fd = info[0].As<Napi::Number>().Int32Value();
  double bytes = info[1].As<Napi::Number>().DoubleValue();
  if (fd < 0 || !(bytes >= 1 && bytes <= 1073741824.0)) {
    Napi::RangeError::New(env, "fd must be >= 0 and bytes 1..2^30").ThrowAsJavaScriptException();
    return Napi::Value();
  }
  int value = static_cast<int>(bytes);
  if (setsockopt(fd, level, option, &value, sizeof value) != 0) {
    SystemError(env, errno, "setsockopt", failure).ThrowAsJavaScriptException();
    return Napi::Value();
  }
  int took = 0;
  socklen_t len = sizeof took;
  if (getsockopt(fd, level, option, &took, &len) != 0) took = 0;
  return Napi::Number::New(env, took);
}

// setReceiveBuffer(fd, bytes): SO_RCVBUF of a connected TCP socket. The kernel doubles the value
// for its bookkeeping and turns off receive-buffer autotuning for the socket, so the window the
// peer sees stays near `bytes` (the stream path's queue bound for a service with a bandwidth
// limit, docs/dataplane.md).
Napi::Value SetReceiveBuffer(const Napi::CallbackInfo& info) {
  return SetByteOption(info, SOL_SOCKET, SO_RCVBUF, "setReceiveBuffer(fd, bytes)", "cannot set SO_RCVBUF");
}

// setNotSentLowat(fd, bytes): TCP_NOTSENT_LOWAT of a connected TCP socket. The kernel then takes
// new bytes (and reports the socket writable) only while fewer than `bytes` of what it holds are
// not yet sent, so what the agent writes ahead waits in the agent, where each stream gets its
// turn, instead of in one FIFO that every stream of a tunnel shares (docs/dataplane.md). Bytes
// in flight are not bounded: throughput is the congestion window's.
Napi::Value SetNotSentLowat(const Napi::CallbackInfo& info) {
  return SetByteOption(info, IPPROTO_TCP, TCP_NOTSENT_LOWAT, "setNotSentLowat(fd, bytes)",
                       "cannot set TCP_NOTSENT_LOWAT");
}

}  // namespace

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("openTransparentListener", Napi::Function::New(env, OpenTransparentListener));
  exports.Set("Connect", Connect::Define(env));
  exports.Set("setReceiveBuffer", Napi::Function::New(env, SetReceiveBuffer));
  exports.Set("setNotSentLowat", Napi::Function::New(env, SetNotSentLowat));
  return exports;
}

#else  // !__linux__

// These socket options are Linux's; the addon still builds elsewhere so that npm install works for
// development, and src/native/sockets.ts reports the platform when called.
Napi::Object Init(Napi::Env env, Napi::Object exports) { return exports; }

#endif

NODE_API_MODULE(mesh_sockets, Init)
