/**
 * bench/failover/hold-server: the far end of the failover bench's long-lived connection, run in
 * the topology's destination namespace (`ip netns exec NS node dist/bench/failover/hold-server.js
 * PORT`). Each connection gets one line, the address it came from (the exit it left by), and is
 * then kept open, silent, until the other side goes: the connection's end is the ingress's doing
 * (or the dead exit's), never this server's. Prints `listening` once it is.
 */
import net from 'node:net';

const port = Number(process.argv[2]);
if (!Number.isInteger(port) || port <= 0) {
  process.stderr.write('usage: hold-server.js PORT\n');
  process.exit(2);
}
net
  .createServer((s) => {
    s.write(`${(s.remoteAddress ?? '').replace(/^::ffff:/, '')}\n`);
    s.on('error', () => {});
    s.on('end', () => s.end());
  })
  .listen(port, '::', () => process.stdout.write('listening\n'));
