/**
 * Replaces the running process image (execv), keeping its pid, namespaces, stdio and environment.
 * Node 20 has no way to reach the syscall, so the mesh_exec addon (native/exec.cc) provides it.
 * The addon serves every Node version alike, rather than Node 22.15+'s experimental
 * process.execve on some and the addon on others: one path, the one CI runs. Used by src/cli (the
 * agent's start with its V8 flags); Node built-ins only.
 */
import { loadAddon } from './load-addon.js';

interface ExecAddon {
  execv(path: string, argv: string[]): never;
}

/**
 * Runs `path` with `argv` (argv[0] included) in place of this process. Returns only by throwing: a
 * system error (code ENOENT, EACCES...) when the kernel refused, or the addon's load error.
 */
export function execInPlace(path: string, argv: string[]): never {
  return loadAddon<ExecAddon>('mesh_exec.node').execv(path, argv);
}
