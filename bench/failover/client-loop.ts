/**
 * bench/failover/client-loop: the client side of the failover bench (run.ts), run in the
 * topology's client namespace:
 * `ip netns exec NS node dist/bench/failover/client-loop.js HOST HTTP_PORT HOLD_PORT INTERVAL_MS TIMEOUT_MS`.
 *
 * - Every INTERVAL_MS it opens a new TCP connection to HOST:HTTP_PORT (test/helpers/netns-apps.ts
 *   `serve`: GET / answers the address it saw the client from, i.e. the exit the connection left
 *   by) and prints one line per connection: `{"e":"conn","start","end","remote"}` or, when it
 *   failed or had no answer within TIMEOUT_MS, `{"e":"conn","start","end","err"}`. A new
 *   connection starts on time whether or not the previous ones are done: during an outage the
 *   loop keeps its resolution.
 * - `hold` on stdin: one connection to HOST:HOLD_PORT (hold-server.ts), kept open. Prints
 *   `{"e":"hold","t","remote"}` when the server has named the address it saw, and
 *   `{"e":"hold-end","t","how"}` when the connection ends (`end`: a FIN, `close`, or the error's
 *   code). `release` on stdin closes it without a line.
 *
 * Times are epoch milliseconds with a fraction (performance.timeOrigin + performance.now()), the
 * clock run.ts stamps its faults with. The connection's answer is read at the TCP level: the
 * ingress accepts the client's connection itself (TPROXY), so a connection that opens proves
 * nothing; only an answer from the destination does.
 */
import net from 'node:net';
import { createInterface } from 'node:readline';

const now = () => performance.timeOrigin + performance.now();
const emit = (o: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(o)}\n`);

function oneConnection(host: string, port: number, timeoutMs: number): void {
  const start = now();
  let answer = '';
  let done = false;
  const finish = (r: { remote: string } | { err: string }) => {
    if (done) return;
    done = true;
    clearTimeout(timer);
    s.destroy();
    emit({ e: 'conn', start, end: now(), ...r });
  };
  const s = net.connect({ host, port });
  const timer = setTimeout(() => finish({ err: 'TIMEOUT' }), timeoutMs);
  s.on('connect', () => s.write(`GET / HTTP/1.0\r\nHost: ${host}\r\n\r\n`));
  s.on('data', (c: Buffer) => {
    answer += c.toString('latin1');
  });
  s.on('end', () => {
    const body = answer.slice(answer.indexOf('\r\n\r\n') + 4);
    try {
      finish({ remote: (JSON.parse(body) as { remote: string }).remote });
    } catch {
      finish({ err: answer === '' ? 'EMPTY' : 'BAD_ANSWER' });
    }
  });
  s.on('error', (err: NodeJS.ErrnoException) => finish({ err: err.code ?? err.message }));
}

function main(): void {
  const [host, httpPort, holdPort, intervalMs, timeoutMs] = process.argv.slice(2);
  if (!host || !httpPort || !holdPort || !intervalMs || !timeoutMs) {
    process.stderr.write('usage: client-loop.js HOST HTTP_PORT HOLD_PORT INTERVAL_MS TIMEOUT_MS\n');
    process.exit(2);
  }
  setInterval(() => oneConnection(host, Number(httpPort), Number(timeoutMs)), Number(intervalMs));

  let held: net.Socket | undefined;
  const hold = () => {
    held?.destroy();
    const s = net.connect({ host, port: Number(holdPort) });
    held = s;
    let line = '';
    let ended = false;
    const end = (how: string) => {
      if (ended || held !== s) return;
      ended = true;
      emit({ e: 'hold-end', t: now(), how });
    };
    s.on('data', (c: Buffer) => {
      if (line.endsWith('\n')) return;
      line += c.toString('latin1');
      if (line.endsWith('\n')) emit({ e: 'hold', t: now(), remote: line.trim() });
    });
    s.on('end', () => end('end'));
    s.on('close', () => end('close'));
    s.on('error', (err: NodeJS.ErrnoException) => end(err.code ?? err.message));
  };
  createInterface({ input: process.stdin }).on('line', (cmd) => {
    if (cmd === 'hold') hold();
    else if (cmd === 'release') {
      const s = held;
      held = undefined;
      s?.destroy();
    }
  });
  // The bench closing our stdin (or dying) ends the loop.
  process.stdin.on('end', () => process.exit(0));
}

main();
