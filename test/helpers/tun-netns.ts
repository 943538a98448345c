/**
 * One throw-away network namespace for tests of the TUN addon (src/native/tun.root.test.ts, bench/native):
 * create it, run `ip -n` and commands inside it with bounded timeouts, delete it (and whatever still runs
 * in it). Names are `<prefix>-<pid>-<n>`, so files running at the same time never share one, and a
 * leftover of a killed run (its pid gone) is removed by the next create().
 * Requires root and iproute2; fails loudly otherwise.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { processAlive } from './exclusive.js';

export interface RunResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

let counter = 0;

/** Throws with the reason when `command` cannot be run here (e.g. ping not installed). */
export function requireCommand(command: string, versionArgs: string[] = ['-V']): void {
  try {
    execFileSync(command, versionArgs, { stdio: 'ignore', timeout: 5000 });
  } catch (e) {
    throw new Error(`this test needs '${command}' (${(e as Error).message})`);
  }
}

export class Netns {
  readonly name: string;
  /** The namespace file, for openTun's netnsPath. */
  readonly path: string;
  readonly #children = new Set<ChildProcess>();

  private constructor(name: string) {
    this.name = name;
    this.path = `/run/netns/${name}`;
  }

  /** Creates `<prefix>-<pid>-<n>` with lo up. */
  static create(prefix: string): Netns {
    if (process.getuid?.() !== 0) throw new Error('network namespace tests need root');
    const list = execFileSync('ip', ['netns', 'list'], { encoding: 'utf8', timeout: 5000 });
    for (const line of list.split('\n')) {
      const name = line.split(' ')[0] ?? '';
      const m = new RegExp(`^${prefix}-(\\d+)-\\d+$`).exec(name);
      if (m && !processAlive(Number(m[1]))) Netns.remove(name);
    }
    const ns = new Netns(`${prefix}-${process.pid}-${++counter}`);
    execFileSync('ip', ['netns', 'add', ns.name], { timeout: 5000 });
    ns.ip('link', 'set', 'lo', 'up');
    return ns;
  }

  private static remove(name: string): void {
    const pids = execFileSync('ip', ['netns', 'pids', name], { encoding: 'utf8', timeout: 5000 })
      .split(/\s+/)
      .filter(Boolean);
    for (const pid of pids) {
      try {
        process.kill(Number(pid), 'SIGKILL');
      } catch {
        // already gone
      }
    }
    execFileSync('ip', ['netns', 'del', name], { timeout: 5000 });
  }

  /** `ip -n <ns> ...`; throws with ip's message on failure. */
  ip(...args: string[]): string {
    try {
      return execFileSync('ip', ['-n', this.name, ...args], {
        encoding: 'utf8',
        timeout: 10_000,
        stdio: 'pipe',
      });
    } catch (e) {
      const err = e as { stderr?: string; message: string };
      throw new Error(`ip -n ${this.name} ${args.join(' ')}: ${err.stderr?.trim() || err.message}`);
    }
  }

  /** Whether `ip -n <ns> link show <dev>` finds the device. */
  hasLink(dev: string): boolean {
    try {
      execFileSync('ip', ['-n', this.name, 'link', 'show', 'dev', dev], { stdio: 'ignore', timeout: 5000 });
      return true;
    } catch {
      return false;
    }
  }

  /** A device's kernel counters (ip -s -j link). */
  linkStats(dev: string): {
    rx: { packets: number; dropped: number };
    tx: { packets: number; dropped: number };
  } {
    const [info] = JSON.parse(this.ip('-s', '-j', 'link', 'show', 'dev', dev)) as {
      stats64: { rx: { packets: number; dropped: number }; tx: { packets: number; dropped: number } };
    }[];
    if (!info) throw new Error(`no stats for ${dev}`);
    return info.stats64;
  }

  /** Starts `command` inside the namespace; killed by delete() at the latest. */
  spawn(command: string, args: string[]): ChildProcess {
    const child = spawn('ip', ['netns', 'exec', this.name, command, ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    this.#children.add(child);
    child.on('exit', () => this.#children.delete(child));
    return child;
  }

  /** Runs `command` inside the namespace to its end, killed after timeoutMs. */
  run(command: string, args: string[], timeoutMs: number): Promise<RunResult> {
    const child = this.spawn(command, args);
    return collect(child, timeoutMs, `${command} ${args.join(' ')}`);
  }

  /** Kills what still runs in the namespace and deletes it. Safe to call twice. */
  delete(): void {
    for (const child of this.#children) child.kill('SIGKILL');
    try {
      Netns.remove(this.name);
    } catch {
      // already deleted
    }
  }
}

/** Waits for a child's exit (SIGKILL after timeoutMs) and returns its output. */
export function collect(child: ChildProcess, timeoutMs: number, what: string): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    let stdout = '';
    let stderr = '';
    child.stdout?.on('data', (d: Buffer) => {
      stdout += d.toString();
    });
    child.stderr?.on('data', (d: Buffer) => {
      stderr += d.toString();
    });
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${what}: still running after ${timeoutMs} ms\nstdout: ${stdout}\nstderr: ${stderr}`));
    }, timeoutMs);
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr });
    });
  });
}
