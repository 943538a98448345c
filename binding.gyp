{
  # The project's native code: the TUN addon loaded by src/native/tun.ts and the socket addon loaded by
  # src/native/sockets.ts. npm install runs `node-gyp rebuild` for the root package because this file
  # exists and package.json has no install script; the results are build/Release/mesh_native.node,
  # build/Release/mesh_sockets.node and build/Release/mesh_exec.node.
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
    },
    {
      # Transparent listeners and marked/transparent connects for the stream path (src/native/sockets.ts).
      # A target of its own so the TUN addon and this one are loaded and changed independently.
      "target_name": "mesh_sockets",
      "sources": ["native/sockets.cc"],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": [
        "NAPI_VERSION=8",
        "NODE_ADDON_API_DISABLE_CPP_EXCEPTIONS",
        "NODE_ADDON_API_DISABLE_DEPRECATED"
      ],
      "cflags_cc": ["-std=c++17", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
      "xcode_settings": { "CLANG_CXX_LANGUAGE_STANDARD": "c++17" }
    },
    {
      # execv() for the agent's one restart in place with its V8 flags (src/native/exec.ts, src/cli/v8-flags.ts).
      "target_name": "mesh_exec",
      "sources": ["native/exec.cc"],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": [
        "NAPI_VERSION=8",
        "NODE_ADDON_API_DISABLE_CPP_EXCEPTIONS",
        "NODE_ADDON_API_DISABLE_DEPRECATED"
      ],
      "cflags_cc": ["-std=c++17", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
      "xcode_settings": { "CLANG_CXX_LANGUAGE_STANDARD": "c++17" }
    },
    {
      # AES-256-GCM with a context kept per session direction, for the kcp transport's datagrams
      # (src/native/aead.ts). OpenSSL is the one Node links: its headers come with Node's, its
      # symbols from the node binary.
      "target_name": "mesh_aead",
      "sources": ["native/aead.cc"],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": [
        "NAPI_VERSION=8",
        "NODE_ADDON_API_DISABLE_CPP_EXCEPTIONS",
        "NODE_ADDON_API_DISABLE_DEPRECATED"
      ],
      "cflags_cc": ["-std=c++17", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
      "xcode_settings": { "CLANG_CXX_LANGUAGE_STANDARD": "c++17" }
    },
    {
      # Netlink requests and libnftables listings, for reading the kernel without a process per
      # question (src/native/netlink.ts; docs/architecture.md, "Reading the kernel").
      "target_name": "mesh_netlink",
      "sources": ["native/netlink.cc"],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": [
        "NAPI_VERSION=8",
        "NODE_ADDON_API_DISABLE_CPP_EXCEPTIONS",
        "NODE_ADDON_API_DISABLE_DEPRECATED"
      ],
      "cflags_cc": ["-std=c++17", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
      "libraries": ["-ldl"],
      "xcode_settings": { "CLANG_CXX_LANGUAGE_STANDARD": "c++17" }
    }
  ]
}
