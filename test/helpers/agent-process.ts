/**
 * Real agent processes for tests: `node dist/src/cli/main.js serve` on a free loopback port
 * with its own data dir, its log captured, stopped by signal or killed with SIGKILL.
 * stop() also checks that no secret the test's clients handled ever reached the log.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ApiClient } from './api-client.js';
import { MovableClock } from './faketime.js';
import type { Vendor } from './licenses.js';
import { freePort } from './ports.js';

export const MAIN_JS = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));

/** `sh -c` script: /proc/sys read-only in this mount namespace, then the command ($0 "$@") in place. */
const READ_ONLY_SYSCTLS =
  'mount --make-rprivate / && mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec "$0" "$@"';

export interface StartOptions {
  vendor?: Vendor;
  dataDir?: string;
  port?: number;
  extraArgs?: string[];
  env?: Record<string, string>;
  readyTimeoutMs?: number;
  /** Run inside this network namespace (`ip netns exec`), for data-plane tests. */
  netns?: string;
  /** `--listen` (default 127.0.0.1:PORT) and the host the test reaches the API at (127.0.0.1). */
  listen?: string;
  apiHost?: string;
  /**
   * With netns: the agent runs in a mount namespace of its own where /proc/sys is read-only (an
   * agent without the right to change sysctls; its namespace's settings stay readable).
   */
  readOnlySysctls?: boolean;
  /**
   * Node's own options, placed before the agent's script (`node NODE_ARGS main.js serve ...`), e.g.
   * `--expose-gc` or `--import MODULE` (the soak bench's probe). They are in the agent's
   * process.execArgv, so its restart in place with its V8 flags keeps them.
   */
  nodeArgs?: string[];
  /** The agent's script (default: this build's dist/src/cli/main.js), e.g. another build's for an A/B bench. */
  mainJs?: string;
  /**
   * Listen on a loopback address of its own (127.X.Y.Z, never 127.0.0.x): the agent then sends
   * its gossip from that address (gossipSourceAddress), so a packet filter can cut its gossip
   * while the test, whose requests come from 127.0.0.1, still reaches it (gossip-cut.ts).
   */
  ownAddress?: boolean;
  /** Run on a clock the test moves forward (`agent.clock`, libfaketime: faketime.ts). */
  movableClock?: boolean;
}

/** A random loopback address outside 127.0.0.0/24, where the tests' own requests come from. */
function ownLoopbackAddress(): string {
  const byte = () => 1 + Math.floor(Math.random() * 254);
  return `127.${byte()}.${byte()}.${byte()}`;
}

export class AgentProcess {
  proc!: ChildProcess;
  private output = '';
  exitCode: number | null = null;
  exitSignal: NodeJS.Signals | null = null;
  private exited!: Promise<void>;
  readonly client: ApiClient;
  /** With `movableClock`: the agent's clock. */
  clock?: MovableClock;

  private constructor(
    readonly port: number,
    readonly dataDir: string,
    private readonly args: string[],
    private readonly env: Record<string, string>,
    private readonly netns?: string,
    private readonly apiHost = '127.0.0.1',
    private readonly readOnlySysctls = false,
    private readonly nodeArgs: readonly string[] = [],
    private readonly mainJs = MAIN_JS,
  ) {
    this.client = new ApiClient(this.url);
  }

  get url(): string {
    return `http://${this.apiHost}:${this.port}`;
  }

  /** host:port where the test and other agents reach this one. */
  get address(): string {
    return `${this.apiHost}:${this.port}`;
  }

  /** With `movableClock`: moves the agent's clock forward and waits until it answers on it. */
  async advanceClock(ms: number): Promise<void> {
    if (!this.clock) throw new Error('the agent was started without movableClock');
    await this.clock.advance(ms, this.client);
  }

  static async start(opts: StartOptions = {}): Promise<AgentProcess> {
    const own = opts.ownAddress ? ownLoopbackAddress() : undefined;
    const port = opts.port ?? (await freePort(own));
    const dataDir = opts.dataDir ?? mkdtempSync(join(tmpdir(), 'mesh-agent-test-'));
    const listen = opts.listen ?? `${own ?? '127.0.0.1'}:${port}`;
    const clock = opts.movableClock ? new MovableClock() : undefined;
    const args = ['serve', '--listen', listen, '--data-dir', dataDir, '--log-level', 'info'];
    if (opts.vendor) args.push('--license-public-key', opts.vendor.publicKeyFile);
    args.push(...(opts.extraArgs ?? []));
    // Agents of API and cluster tests share the host's network namespace: their data plane stays
    // off (as root, `auto` would turn it on), and the data-plane tests give each agent its own.
    if (!args.includes('--dataplane')) args.push('--dataplane', 'off');
    const agent = new AgentProcess(
      port,
      dataDir,
      args,
      { ...opts.env, ...clock?.env },
      opts.netns,
      opts.apiHost ?? own,
      opts.readOnlySysctls ?? false,
      opts.nodeArgs ?? [],
      opts.mainJs,
    );
    agent.clock = clock;
    await agent.launch(opts.readyTimeoutMs ?? 20_000);
    return agent;
  }

  /** The agent's pid (also after its restart in place with its V8 flags: execv keeps the pid). */
  get pid(): number {
    return this.proc.pid!;
  }

  /** Everything the process wrote to stdout and stderr so far. */
  get logs(): string {
    return this.output;
  }

  private async launch(readyTimeoutMs: number): Promise<void> {
    this.exitCode = null;
    this.exitSignal = null;
    // `ip netns exec` execs the command in place: the child's pid is the agent's own.
    // The shell execs node in place too.
    const readOnly = ['unshare', '--mount', 'sh', '-c', READ_ONLY_SYSCTLS];
    const [command, ...argv] = this.netns
      ? [
          'ip',
          'netns',
          'exec',
          this.netns,
          ...(this.readOnlySysctls ? readOnly : []),
          process.execPath,
          ...this.nodeArgs,
          this.mainJs,
          ...this.args,
        ]
      : [process.execPath, ...this.nodeArgs, this.mainJs, ...this.args];
    this.proc = spawn(command!, argv, {
      env: { ...process.env, ...this.env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    this.proc.stdout!.on('data', (c: Buffer) => {
      this.output += c.toString();
    });
    this.proc.stderr!.on('data', (c: Buffer) => {
      this.output += c.toString();
    });
    this.exited = new Promise((resolve) =>
      this.proc.once('exit', (code, signal) => {
        this.exitCode = code;
        this.exitSignal = signal;
        resolve();
      }),
    );
    const deadline = Date.now() + readyTimeoutMs;
    while (Date.now() < deadline) {
      if (this.exitCode !== null || this.exitSignal !== null) {
        throw new Error(`agent exited during start (${this.exitCode ?? this.exitSignal}):\n${this.output}`);
      }
      try {
        const res = await this.client.raw('GET', '/readyz', { timeoutMs: 1000 });
        if (res.status === 200) return;
      } catch {
        // not listening yet
      }
      await new Promise((r) => setTimeout(r, 50));
    }
    this.proc.kill('SIGKILL');
    throw new Error(`agent did not become ready in ${readyTimeoutMs} ms:\n${this.output}`);
  }

  /** Stops with a signal and returns the exit code; throws if a handled secret is in the log. */
  async stop(signal: NodeJS.Signals = 'SIGTERM', timeoutMs = 15_000): Promise<number | null> {
    if (this.exitCode === null && this.exitSignal === null) {
      this.proc.kill(signal);
      const timer = setTimeout(() => this.proc.kill('SIGKILL'), timeoutMs);
      await this.exited;
      clearTimeout(timer);
    }
    this.assertNoSecretsInLogs();
    return this.exitCode;
  }

  async kill9(): Promise<void> {
    this.proc.kill('SIGKILL');
    await this.exited;
  }

  /** Starts the process again on the same port and data dir. */
  async restart(readyTimeoutMs = 20_000): Promise<void> {
    if (this.exitCode === null && this.exitSignal === null) throw new Error('agent is still running');
    await this.launch(readyTimeoutMs);
  }

  assertNoSecretsInLogs(): void {
    for (const secret of this.client.secretsSeen) {
      if (secret.length >= 16 && this.output.includes(secret)) {
        throw new Error(
          `a secret or token handled by the test appears in the agent's log: ${secret.slice(0, 8)}…`,
        );
      }
    }
  }
}

/** Bootstraps the agent with a fresh license of the vendor; returns the first credential. */
export async function bootstrap(
  agent: Pick<AgentProcess, 'client'>,
  vendor: Vendor,
  overrides: Parameters<Vendor['sign']>[0] = {},
): Promise<{ clientId: string; clientSecret: string; body: Record<string, unknown> }> {
  const res = await agent.client.post('/v1/bootstrap', {
    json: { license: vendor.sign(overrides), name: 'test' },
  });
  if (res.status !== 201) throw new Error(`bootstrap failed: ${res.status} ${res.text}`);
  return { clientId: res.body.client_id, clientSecret: res.body.client_secret, body: res.body };
}
