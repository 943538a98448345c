/**
 * Replaces the running process image (execv), keeping its pid, namespaces, open stdio and
 * environment. Node 22.15+ has this as process.execve; Node 20 has no way to reach the syscall, so
 * the mesh_exec addon (native/exec.cc) provides it there. Used by src/cli (the agent's start with
 * its V8 flags); Node built-ins only.
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
  const builtin = (process as { execve?: (file: string, args: string[], env: NodeJS.ProcessEnv) => never })
    .execve;
  if (builtin) return builtin(path, argv, process.env);
  return loadAddon<ExecAddon>('mesh_exec.node').execv(path, argv);
}
