{
  # The project's only native code: the TUN addon loaded by src/native/tun.ts.
  # npm install runs `node-gyp rebuild` for the root package because this file exists and package.json
  # has no install script; the result is build/Release/mesh_native.node.
  "targets": [
    {
      "target_name": "mesh_native",
      "sources": ["native/tun.cc"],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": [
        "NAPI_VERSION=8",
        "NODE_ADDON_API_DISABLE_CPP_EXCEPTIONS",
        "NODE_ADDON_API_DISABLE_DEPRECATED"
      ],
      "cflags_cc": ["-std=c++17", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
      "xcode_settings": { "CLANG_CXX_LANGUAGE_STANDARD": "c++17" }
    }
  ]
}
