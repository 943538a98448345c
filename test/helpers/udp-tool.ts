/**
 * A tiny UDP sender/receiver run as a child process inside a test network namespace (tests and benches
 * of the TUN addon). Payloads are seqPayload()s, so the other side can check each datagram.
 *
 *   node udp-tool.js send <dst> <port> <count> <minLen> <maxLen>   -> {"sent":n,"errors":n}
 *   node udp-tool.js recv <addr> <port> <count> <timeoutMs>        -> "ready" line, then
 *        {"received":n,"distinct":n,"bad":n}  once count distinct datagrams arrived or timeoutMs passed
 */
import { createSocket } from 'node:dgram';
import { isIPv6 } from 'node:net';
import { checkSeqPayload, seqPayload } from './ip-packets.js';

function send(dst: string, port: number, count: number, minLen: number, maxLen: number): void {
  const socket = createSocket(isIPv6(dst) ? 'udp6' : 'udp4');
  let done = 0;
  let errors = 0;
  const span = maxLen - minLen + 1;
  socket.connect(port, dst, () => {
    for (let seq = 0; seq < count; seq++) {
      socket.send(seqPayload(seq, minLen + (seq % span)), (err) => {
        if (err) errors++;
        if (++done === count) {
          process.stdout.write(`${JSON.stringify({ sent: count - errors, errors })}\n`);
          socket.close();
        }
      });
    }
  });
}

function recv(addr: string, port: number, count: number, timeoutMs: number): void {
  const socket = createSocket({ type: isIPv6(addr) ? 'udp6' : 'udp4', recvBufferSize: 4 << 20 });
  const seen = new Set<number>();
  let received = 0;
  let bad = 0;
  const finish = () => {
    clearTimeout(timer);
    process.stdout.write(`${JSON.stringify({ received, distinct: seen.size, bad })}\n`);
    socket.close();
  };
  const timer = setTimeout(finish, timeoutMs);
  socket.on('message', (msg) => {
    received++;
    const seq = checkSeqPayload(msg);
    if (seq < 0) bad++;
    else seen.add(seq);
    if (seen.size === count) finish();
  });
  socket.bind(port, addr, () => process.stdout.write('ready\n'));
}

const [mode, host, port, a, b] = process.argv.slice(2);
if (mode === 'send') send(host!, Number(port), Number(a), Number(b), Number(process.argv[7] ?? b));
else if (mode === 'recv') recv(host!, Number(port), Number(a), Number(b));
else {
  process.stderr.write('usage: udp-tool send|recv ...\n');
  process.exit(2);
}
