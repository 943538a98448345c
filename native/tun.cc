/*
 * mesh_native: the project's only native code. It opens Linux TUN devices (IFF_TUN | IFF_NO_PI, one queue,
 * not persistent) and moves IP packets between them and JavaScript in batches. Reading is driven by the
 * event loop (uv_poll on the non-blocking fd): no thread and no libuv thread pool is involved, so the
 * packet path never waits behind file-system or DNS work and never needs locking.
 *
 * Only src/native/tun.ts loads this addon; everything else goes through that wrapper.
 *
 * JS surface (class Tun):
 *   new Tun(name, netnsPath | null, mtu, batchPackets, batchBytes, onBatch(buffer, count), onError(err))
 *   ifname() -> string            the name the kernel gave the device (always the name asked for)
 *   lengths() -> Uint32Array      shared with onBatch: lengths[i] is the length of packet i of the batch
 *   resume() / pause()            start / stop polling
 *   write(Uint8Array[]) -> n      one write() per packet, n = packets the kernel took
 *   writeBatch(buf, Uint32Array lengths, count) -> n   the same for packets laid end to end in one buffer
 *   close()                       idempotent, safe inside onBatch; lets go of both listeners
 *   stats() -> object
 */
#include <napi.h>

#include "system-error.h"

#ifdef __linux__

#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <memory>
#include <string>
#include <vector>

namespace {

// Room after the batch byte bound so that the last read() of a batch can never truncate a packet:
// a TUN device's MTU, and so its largest packet, is at most 65535 bytes.
constexpr size_t kMaxPacket = 65536;
constexpr uint32_t kMaxBatchPackets = 4096;
constexpr size_t kMaxBatchBytes = 16u << 20;

using mesh::ErrnoCode;
using mesh::SystemError;

Napi::Error InvalidName(Napi::Env env, const std::string& name, const std::string& why) {
  Napi::Error e = Napi::Error::New(env, "invalid TUN device name '" + name + "': " + why);
  e.Set("code", Napi::String::New(env, "EINVAL"));
  e.Set("errno", Napi::Number::New(env, -EINVAL));
  return e;
}

// Names are decided by the caller and used as they are: no kernel '%d' templates, nothing that `ip`
// or sysfs would treat specially.
bool ValidName(const std::string& name, std::string* why) {
  if (name.empty() || name.size() >= IFNAMSIZ) {
    *why = "must be 1 to " + std::to_string(IFNAMSIZ - 1) + " characters";
    return false;
  }
  if (name == "." || name == "..") {
    *why = "'.' and '..' are not device names";
    return false;
  }
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
              c == '_' || c == '.';
    if (!ok) {
      *why = "only letters, digits, '-', '_' and '.' are allowed";
      return false;
    }
  }
  return true;
}

struct OpenFailure {
  int err = 0;
  std::string syscall;
  std::string what;
};

// Opens and configures the device in the calling thread's current network namespace.
int OpenHere(const std::string& name, int mtu, OpenFailure* fail) {
  int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    *fail = {errno, "open", "cannot open /dev/net/tun"};
    return -1;
  }
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  // IFF_TUN_EXCL: never attach to a device that already exists (a persistent one left by someone else
  // would otherwise be adopted silently and outlive us); the name must be free.
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI | IFF_TUN_EXCL;
  memcpy(ifr.ifr_name, name.data(), name.size());
  if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
    int err = errno;
    std::string what = err == EBUSY ? "TUN device name '" + name + "' is already in use"
                                    : "cannot create TUN device '" + name + "'";
    *fail = {err, "ioctl(TUNSETIFF)", what};
    close(fd);
    return -1;
  }
  if (mtu > 0) {
    int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (sock < 0) {
      *fail = {errno, "socket", "cannot set the MTU of '" + name + "'"};
      close(fd);
      return -1;
    }
    struct ifreq m;
    memset(&m, 0, sizeof m);
    memcpy(m.ifr_name, name.data(), name.size());
    m.ifr_mtu = mtu;
    int rc = ioctl(sock, SIOCSIFMTU, &m);
    int err = errno;
    close(sock);
    if (rc < 0) {
      *fail = {err, "ioctl(SIOCSIFMTU)", "cannot set MTU " + std::to_string(mtu) + " on '" + name + "'"};
      close(fd);
      return -1;
    }
  }
  return fd;
}

// The namespace a TUN device lives in is the one of the thread that opens /dev/net/tun, so with a
// netnsPath the calling thread enters that namespace for the open and the ioctls only, and comes back.
// The fd stays with this process; the device, its addresses and routes live in the other namespace.
int OpenIn(const std::string& name, int mtu, const std::string& netnsPath, OpenFailure* fail) {
  if (netnsPath.empty()) return OpenHere(name, mtu, fail);
  int self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  if (self < 0) {
    *fail = {errno, "open", "cannot open /proc/thread-self/ns/net"};
    return -1;
  }
  int target = open(netnsPath.c_str(), O_RDONLY | O_CLOEXEC);
  if (target < 0) {
    *fail = {errno, "open", "cannot open network namespace " + netnsPath};
    close(self);
    return -1;
  }
  if (setns(target, CLONE_NEWNET) < 0) {
    *fail = {errno, "setns", "cannot enter network namespace " + netnsPath};
    close(target);
    close(self);
    return -1;
  }
  int fd = OpenHere(name, mtu, fail);
  if (setns(self, CLONE_NEWNET) < 0) {
    // Every socket this thread opened later would land in the wrong namespace: no way to go on safely.
    fprintf(stderr, "mesh_native: cannot return to the original network namespace: %s\n", strerror(errno));
    abort();
  }
  close(target);
  close(self);
  return fd;
}

class Tun : public Napi::ObjectWrap<Tun> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "Tun",
                       {
                           InstanceMethod<&Tun::IfName>("ifname"),
                           InstanceMethod<&Tun::Lengths>("lengths"),
                           InstanceMethod<&Tun::Resume>("resume"),
                           InstanceMethod<&Tun::Pause>("pause"),
                           InstanceMethod<&Tun::Write>("write"),
                           InstanceMethod<&Tun::WriteBatch>("writeBatch"),
                           InstanceMethod<&Tun::Close>("close"),
                           InstanceMethod<&Tun::Stats>("stats"),
                       });
  }

  explicit Tun(const Napi::CallbackInfo& info) : Napi::ObjectWrap<Tun>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 7 || !info[0].IsString() || !info[3].IsNumber() || !info[4].IsNumber() ||
        !info[5].IsFunction() || !info[6].IsFunction()) {
      Napi::TypeError::New(env, "Tun(name, netnsPath, mtu, batchPackets, batchBytes, onBatch, onError)")
          .ThrowAsJavaScriptException();
      return;
    }
    std::string name = info[0].As<Napi::String>().Utf8Value();
    std::string why;
    if (!ValidName(name, &why)) {
      InvalidName(env, name, why).ThrowAsJavaScriptException();
      return;
    }
    std::string netnsPath;
    if (info[1].IsString()) netnsPath = info[1].As<Napi::String>().Utf8Value();
    int mtu = info[2].IsNumber() ? info[2].As<Napi::Number>().Int32Value() : 0;
    if (mtu < 0 || mtu > 65535) {
      Napi::RangeError::New(env, "mtu must be 0 (leave as is) to 65535").ThrowAsJavaScriptException();
      return;
    }
    double packets = info[3].As<Napi::Number>().DoubleValue();
    double bytes = info[4].As<Napi::Number>().DoubleValue();
    if (!(packets >= 1 && packets <= kMaxBatchPackets) || !(bytes >= 1 && bytes <= kMaxBatchBytes)) {
      Napi::RangeError::New(env, "batchPackets must be 1.." + std::to_string(kMaxBatchPackets) +
                                     ", batchBytes 1.." + std::to_string(kMaxBatchBytes))
          .ThrowAsJavaScriptException();
      return;
    }
    batchPackets_ = static_cast<uint32_t>(packets);
    batchBytes_ = static_cast<size_t>(bytes);

    OpenFailure fail;
    int fd = OpenIn(name, mtu, netnsPath, &fail);
    if (fd < 0) {
      SystemError(env, fail.err, fail.syscall, fail.what).ThrowAsJavaScriptException();
      return;
    }
    uv_loop_t* loop = nullptr;
    if (napi_get_uv_event_loop(env, &loop) != napi_ok || loop == nullptr) {
      close(fd);
      Napi::Error::New(env, "no event loop").ThrowAsJavaScriptException();
      return;
    }
    auto* poll = new uv_poll_t;
    int rc = uv_poll_init(loop, poll, fd);
    if (rc != 0) {
      delete poll;  // uv_poll_init leaves nothing registered when it fails
      close(fd);
      SystemError(env, -rc, "uv_poll_init", "cannot poll TUN device '" + name + "'")
          .ThrowAsJavaScriptException();
      return;
    }
    poll->data = this;
    fd_ = fd;
    poll_ = poll;
    name_ = name;
    scratch_.resize(batchBytes_ + kMaxPacket);

    Napi::Uint32Array lengths = Napi::Uint32Array::New(env, batchPackets_);
    lengthsData_ = lengths.Data();
    lengths_ = Napi::Persistent(lengths);
    onBatch_ = Napi::Persistent(info[5].As<Napi::Function>());
    onError_ = Napi::Persistent(info[6].As<Napi::Function>());
    // A fresh object as the async resource: the wrapper itself would be held strongly by the context.
    context_ = std::make_unique<Napi::AsyncContext>(env, "MeshTunRead", Napi::Object::New(env));
    // An open device stays alive until close(), like a socket: nobody has to hold it for reads to go on.
    Ref();
  }

  ~Tun() override { Release(); }

 private:
  Napi::Value IfName(const Napi::CallbackInfo& info) { return Napi::String::New(info.Env(), name_); }

  Napi::Value Lengths(const Napi::CallbackInfo& info) { return lengths_.Value(); }

  Napi::Value Resume(const Napi::CallbackInfo& info) {
    if (fd_ >= 0 && !polling_) {
      int rc = uv_poll_start(poll_, UV_READABLE, OnPoll);
      if (rc != 0) {
        SystemError(info.Env(), -rc, "uv_poll_start", "cannot poll TUN device '" + name_ + "'")
            .ThrowAsJavaScriptException();
        return info.Env().Undefined();
      }
      polling_ = true;
    }
    return info.Env().Undefined();
  }

  Napi::Value Pause(const Napi::CallbackInfo& info) {
    StopPolling();
    return info.Env().Undefined();
  }

  Napi::Value Close(const Napi::CallbackInfo& info) {
    if (fd_ >= 0) {
      Release();
      // The listeners are strong references from outside the JS heap, and their closures hold the
      // device that holds this object: kept, they would keep it (and its read area) alive for good.
      // Safe inside a listener: the function running stays alive on the stack.
      onBatch_.Reset();
      onError_.Reset();
      Unref();
    }
    return info.Env().Undefined();
  }

  // One write() per packet: a TUN fd takes exactly one packet per write, so writev cannot batch. The batch
  // is in crossing JS -> C++ once. A packet the kernel refuses (ENOBUFS, EINVAL for a malformed packet,
  // EIO while the link is down, ...) is a drop, counted, not an exception.
  Napi::Value Write(const Napi::CallbackInfo& info) {
    napi_env env = info.Env();
    if (info.Length() < 1 || !info[0].IsArray()) {
      Napi::TypeError::New(env, "write(packets: Uint8Array[])").ThrowAsJavaScriptException();
      return Napi::Value();
    }
    napi_value array = info[0];
    uint32_t count = 0;
    napi_get_array_length(env, array, &count);
    uint32_t written = 0;
    for (uint32_t i = 0; i < count; i++) {
      napi_value item;
      napi_typedarray_type type;
      size_t length = 0;
      void* data = nullptr;
      if (napi_get_element(env, array, i, &item) != napi_ok ||
          napi_get_typedarray_info(env, item, &type, &length, &data, nullptr, nullptr) != napi_ok ||
          type != napi_uint8_array) {
        bool pending = false;
        napi_is_exception_pending(env, &pending);
        if (pending) {
          Napi::Error e = Napi::Env(env).GetAndClearPendingException();
          (void)e;
        }
        Napi::TypeError::New(env, "write: packet " + std::to_string(i) + " is not a Buffer/Uint8Array")
            .ThrowAsJavaScriptException();
        return Napi::Value();
      }
      if (fd_ >= 0 && WriteOne(static_cast<const uint8_t*>(data), length)) written++;
    }
    return Napi::Number::New(env, written);
  }

  Napi::Value WriteBatch(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (info.Length() < 3 || !info[0].IsTypedArray() || !info[1].IsTypedArray() || !info[2].IsNumber() ||
        info[0].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array ||
        info[1].As<Napi::TypedArray>().TypedArrayType() != napi_uint32_array) {
      Napi::TypeError::New(env, "writeBatch(buffer: Uint8Array, lengths: Uint32Array, count: number)")
          .ThrowAsJavaScriptException();
      return Napi::Value();
    }
    auto buffer = info[0].As<Napi::Uint8Array>();
    auto lengths = info[1].As<Napi::Uint32Array>();
    double countArg = info[2].As<Napi::Number>().DoubleValue();
    if (!(countArg >= 0 && countArg <= static_cast<double>(lengths.ElementLength()))) {
      Napi::RangeError::New(env, "writeBatch: count exceeds lengths").ThrowAsJavaScriptException();
      return Napi::Value();
    }
    size_t count = static_cast<size_t>(countArg);
    const uint8_t* data = buffer.Data();
    size_t size = buffer.ByteLength();
    size_t total = 0;
    for (size_t i = 0; i < count; i++) total += lengths[i];
    if (total > size) {
      Napi::RangeError::New(env, "writeBatch: lengths add up to more than the buffer")
          .ThrowAsJavaScriptException();
      return Napi::Value();
    }
    uint32_t written = 0;
    size_t off = 0;
    for (size_t i = 0; i < count && fd_ >= 0; i++) {
      if (WriteOne(data + off, lengths[i])) written++;
      off += lengths[i];
    }
    return Napi::Number::New(env, written);
  }

  Napi::Value Stats(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Napi::Object o = Napi::Object::New(env);
    o.Set("packetsRead", Napi::Number::New(env, static_cast<double>(packetsRead_)));
    o.Set("bytesRead", Napi::Number::New(env, static_cast<double>(bytesRead_)));
    o.Set("readBatches", Napi::Number::New(env, static_cast<double>(readBatches_)));
    o.Set("readErrors", Napi::Number::New(env, static_cast<double>(readErrors_)));
    o.Set("packetsWritten", Napi::Number::New(env, static_cast<double>(packetsWritten_)));
    o.Set("bytesWritten", Napi::Number::New(env, static_cast<double>(bytesWritten_)));
    o.Set("writeDrops", Napi::Number::New(env, static_cast<double>(writeDrops_)));
    if (lastWriteErrno_ != 0)
      o.Set("lastWriteError", Napi::String::New(env, ErrnoCode(lastWriteErrno_)));
    else
      o.Set("lastWriteError", env.Null());
    return o;
  }

  bool WriteOne(const uint8_t* data, size_t length) {
    for (;;) {
      ssize_t n = ::write(fd_, data, length);
      if (n >= 0) {
        packetsWritten_++;
        bytesWritten_ += static_cast<uint64_t>(n);
        return true;
      }
      if (errno == EINTR) continue;
      writeDrops_++;
      lastWriteErrno_ = errno;
      return false;
    }
  }

  void StopPolling() {
    if (polling_) {
      uv_poll_stop(poll_);
      polling_ = false;
    }
  }

  // Stops polling and closes the fd: the kernel deletes the (non-persistent) device right then.
  // The poll handle is closed first, so the fd leaves epoll before it is closed.
  void Release() {
    if (fd_ < 0) return;
    StopPolling();
    poll_->data = nullptr;
    uv_close(reinterpret_cast<uv_handle_t*>(poll_), [](uv_handle_t* h) { delete reinterpret_cast<uv_poll_t*>(h); });
    poll_ = nullptr;
    close(fd_);
    fd_ = -1;
  }

  static void OnPoll(uv_poll_t* handle, int status, int events) {
    auto* self = static_cast<Tun*>(handle->data);
    if (self != nullptr) self->Readable(status);
  }

  void Readable(int status) {
    if (fd_ < 0) return;
    Napi::Env env = Env();
    Napi::HandleScope scope(env);
    Napi::Object self = Value();  // holds the wrapper while JS runs, even if the listener closes us
    if (status < 0) {
      StopPolling();
      readErrors_++;
      // POLLERR: the device was deleted under the open fd (ip link del, or its namespace went away).
      EmitError(self, SystemError(env, -status, "uv_poll",
                                  "TUN device '" + name_ + "' failed while polling (deleted?)"));
      return;
    }
    uint8_t* base = scratch_.data();
    size_t capacity = scratch_.size();
    size_t off = 0;
    uint32_t count = 0;
    int err = 0;
    while (count < batchPackets_ && off < batchBytes_) {
      ssize_t n = ::read(fd_, base + off, capacity - off);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) err = errno;
        break;
      }
      if (n == 0) break;
      lengthsData_[count++] = static_cast<uint32_t>(n);
      off += static_cast<size_t>(n);
    }
    if (count > 0) {
      packetsRead_ += count;
      bytesRead_ += off;
      readBatches_++;
      // One fresh buffer per batch, sized to what was read: the packets handed to JS are views into it
      // and may be kept by the listener, while the scratch area is reused for the next batch.
      Napi::Buffer<uint8_t> batch = Napi::Buffer<uint8_t>::Copy(env, base, off);
      napi_value args[2] = {batch, Napi::Number::New(env, count)};
      onBatch_.MakeCallback(self, 2, args, *context_);
      RethrowPending(env);
    }
    if (err != 0 && fd_ >= 0) {
      StopPolling();
      readErrors_++;
      EmitError(self, SystemError(env, err, "read", "reading TUN device '" + name_ + "' failed"));
    }
  }

  void EmitError(Napi::Object self, Napi::Error error) {
    Napi::Env env = Env();
    napi_value args[1] = {error.Value()};
    onError_.MakeCallback(self, 1, args, *context_);
    RethrowPending(env);
  }

  // A listener that throws is an uncaught exception of the process, as for Node's own callbacks.
  static void RethrowPending(Napi::Env env) {
    if (env.IsExceptionPending()) {
      Napi::Error e = env.GetAndClearPendingException();
      napi_fatal_exception(env, e.Value());
    }
  }

  int fd_ = -1;
  uv_poll_t* poll_ = nullptr;
  bool polling_ = false;
  std::string name_;
  uint32_t batchPackets_ = 64;
  size_t batchBytes_ = 256 * 1024;
  std::vector<uint8_t> scratch_;
  uint32_t* lengthsData_ = nullptr;
  Napi::Reference<Napi::Uint32Array> lengths_;
  Napi::FunctionReference onBatch_;
  Napi::FunctionReference onError_;
  std::unique_ptr<Napi::AsyncContext> context_;

  uint64_t packetsRead_ = 0;
  uint64_t bytesRead_ = 0;
  uint64_t readBatches_ = 0;
  uint64_t readErrors_ = 0;
  uint64_t packetsWritten_ = 0;
  uint64_t bytesWritten_ = 0;
  uint64_t writeDrops_ = 0;
  int lastWriteErrno_ = 0;
};

}  // namespace

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("Tun", Tun::Define(env));
  return exports;
}

#else  // !__linux__

// TUN devices as used here are Linux-only; the addon still builds elsewhere so that npm install works
// for development, and src/native/tun.ts reports the platform when a device is opened.
Napi::Object Init(Napi::Env env, Napi::Object exports) { return exports; }

#endif

NODE_API_MODULE(mesh_native, Init)
