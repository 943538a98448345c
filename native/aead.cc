/*
 * mesh_aead: AES-256-GCM on datagrams, for the kcp transport's sessions (src/transports/kcp/
 * secure-datagram.ts, through src/native/aead.ts).
 *
 * Why native: node:crypto makes a new cipher object per nonce (createCipheriv / createDecipheriv),
 * and with it a new OpenSSL context and key schedule. For a 1200-byte datagram that set-up is
 * nearly all of the cost: a session's seal + open took about 20 µs that way, 4 µs with a context
 * kept per key (bench/transports/kcp-seal). Here each direction of a session keeps one context with the key
 * expanded once; a datagram only sets its nonce. The cipher is OpenSSL's, the one Node itself
 * links: this file calls EVP and adds no cryptography of its own.
 *
 * JS surface (lengths and offsets are checked here as well as in aead.ts: a wrong one must never
 * reach memory outside the buffers):
 *   new AesGcm(key Buffer[32], forSealing boolean)
 *   AesGcm#seal(nonce Buffer[12], datagram Buffer, aadLength)
 *     datagram = [aad: aadLength][plaintext][16 bytes of room]; encrypts the plaintext in place
 *     and writes the tag into the room.
 *   AesGcm#open(nonce Buffer[12], datagram Buffer, aadLength) -> boolean
 *     datagram = [aad: aadLength][ciphertext][tag 16]; decrypts in place. false when the tag does
 *     not authenticate: the bytes between aad and tag are then garbage.
 * A context seals or opens, as made; it is freed (and its key schedule wiped by OpenSSL) when the
 * JS object is collected.
 */
#include <napi.h>
#include <openssl/evp.h>

#include <cstdint>

namespace {

constexpr size_t kKeyBytes = 32;
constexpr size_t kNonceBytes = 12;
constexpr size_t kTagBytes = 16;

bool BufferOf(const Napi::Value& v, uint8_t** data, size_t* length) {
  if (!v.IsBuffer()) return false;
  auto b = v.As<Napi::Buffer<uint8_t>>();
  *data = b.Data();
  *length = b.Length();
  return true;
}

class AesGcm : public Napi::ObjectWrap<AesGcm> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "AesGcm",
                       {InstanceMethod<&AesGcm::Seal>("seal"), InstanceMethod<&AesGcm::Open>("open")});
  }

  explicit AesGcm(const Napi::CallbackInfo& info) : Napi::ObjectWrap<AesGcm>(info) {
    Napi::Env env = info.Env();
    uint8_t* key = nullptr;
    size_t keyLength = 0;
    if (info.Length() < 2 || !BufferOf(info[0], &key, &keyLength) || keyLength != kKeyBytes ||
        !info[1].IsBoolean()) {
      Napi::TypeError::New(env, "AesGcm(key Buffer of 32 bytes, forSealing boolean)").ThrowAsJavaScriptException();
      return;
    }
    sealing_ = info[1].As<Napi::Boolean>().Value();
    ctx_ = EVP_CIPHER_CTX_new();
    // The key is expanded once here; each datagram then passes only its nonce (a null cipher and
    // key keep what the context holds, direction -1 keeps the direction).
    bool ok = ctx_ != nullptr &&
              EVP_CipherInit_ex(ctx_, EVP_aes_256_gcm(), nullptr, nullptr, nullptr, sealing_ ? 1 : 0) == 1 &&
              EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_SET_IVLEN, kNonceBytes, nullptr) == 1 &&
              EVP_CipherInit_ex(ctx_, nullptr, nullptr, key, nullptr, -1) == 1;
    if (!ok) {
      Napi::Error::New(env, "cannot set up AES-256-GCM (OpenSSL)").ThrowAsJavaScriptException();
      return;
    }
  }

  ~AesGcm() override {
    if (ctx_ != nullptr) EVP_CIPHER_CTX_free(ctx_);  // cleanses the key schedule
  }

 private:
  // The nonce, the datagram and its aad length from (nonce, datagram, aadLength), checked: the
  // datagram must hold the aad and a tag.
  bool Arguments(const Napi::CallbackInfo& info, const uint8_t** nonce, uint8_t** datagram, size_t* length,
                 size_t* aadLength) {
    uint8_t* n = nullptr;
    size_t nonceLength = 0;
    if (info.Length() < 3 || !BufferOf(info[0], &n, &nonceLength) || nonceLength != kNonceBytes ||
        !BufferOf(info[1], datagram, length) || !info[2].IsNumber()) {
      Napi::TypeError::New(info.Env(), "(nonce Buffer of 12 bytes, datagram Buffer, aadLength)")
          .ThrowAsJavaScriptException();
      return false;
    }
    double aad = info[2].As<Napi::Number>().DoubleValue();
    // Range first: casting a double beyond size_t (Infinity, 2^64) is undefined.
    if (!(aad >= 0 && aad <= static_cast<double>(*length)) || aad != static_cast<double>(static_cast<size_t>(aad)) ||
        static_cast<size_t>(aad) + kTagBytes > *length || *length > INT32_MAX) {
      Napi::RangeError::New(info.Env(), "the datagram must hold aadLength bytes and a 16-byte tag")
          .ThrowAsJavaScriptException();
      return false;
    }
    *nonce = n;
    *aadLength = static_cast<size_t>(aad);
    return true;
  }

  Napi::Value Seal(const Napi::CallbackInfo& info) { return Apply(info, true); }
  Napi::Value Open(const Napi::CallbackInfo& info) { return Apply(info, false); }

  // Seals (undefined, or throws) or opens (whether the tag authenticated) one datagram in place.
  Napi::Value Apply(const Napi::CallbackInfo& info, bool seal) {
    Napi::Env env = info.Env();
    if (seal != sealing_) {
      Napi::Error::New(env, sealing_ ? "this AesGcm seals; it cannot open" : "this AesGcm opens; it cannot seal")
          .ThrowAsJavaScriptException();
      return Napi::Value();
    }
    const uint8_t* nonce;
    uint8_t* d;
    size_t length, aad;
    if (!Arguments(info, &nonce, &d, &length, &aad)) return Napi::Value();
    size_t text = length - aad - kTagBytes;
    uint8_t* tag = d + aad + text;
    int out = 0;
    // Opening, the tag goes in before Final, which checks it (GCM's Final writes no bytes): a
    // forged datagram fails there. Sealing, the tag comes out after Final.
    bool ok = EVP_CipherInit_ex(ctx_, nullptr, nullptr, nullptr, nonce, -1) == 1 &&
              (aad == 0 || EVP_CipherUpdate(ctx_, nullptr, &out, d, static_cast<int>(aad)) == 1) &&
              (text == 0 || EVP_CipherUpdate(ctx_, d + aad, &out, d + aad, static_cast<int>(text)) == 1) &&
              (seal || EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_SET_TAG, kTagBytes, tag) == 1) &&
              EVP_CipherFinal_ex(ctx_, tag, &out) == 1 &&
              (!seal || EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_GET_TAG, kTagBytes, tag) == 1);
    if (!seal) return Napi::Boolean::New(env, ok);
    if (!ok) Napi::Error::New(env, "AES-256-GCM seal failed (OpenSSL)").ThrowAsJavaScriptException();
    return Napi::Value();
  }

  EVP_CIPHER_CTX* ctx_ = nullptr;
  bool sealing_ = false;
};

}  // namespace

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("AesGcm", AesGcm::Define(env));
  return exports;
}

NODE_API_MODULE(mesh_aead, Init)
