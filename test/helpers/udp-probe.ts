/**
 * One UDP datagram per line of stdin, run inside a test network namespace (`ip netns exec NS node
 * dist/test/helpers/udp-probe.js`): each line `SOURCE DESTINATION PORT TEXT` sends TEXT from
 * SOURCE (an address of the namespace, bound) to DESTINATION:PORT and prints `sent TEXT` (or
 * `error TEXT message`). One process for many packets: the explain property test sends
 * hundreds, one at a time.
 */
import dgram from 'node:dgram';
import { createInterface } from 'node:readline';

const lines = createInterface({ input: process.stdin });
lines.on('line', (line) => {
  const [source, destination, port, text] = line.trim().split(' ');
  if (!source || !destination || !port || !text) return;
  const socket = dgram.createSocket(destination.includes(':') ? 'udp6' : 'udp4');
  const done = (outcome: string) => {
    process.stdout.write(`${outcome}\n`);
    socket.close();
  };
  socket.on('error', (err) => done(`error ${text} ${err.message}`));
  socket.bind(0, source, () =>
    socket.send(text, Number(port), destination, (err) =>
      done(err ? `error ${text} ${err.message}` : `sent ${text}`),
    ),
  );
});
lines.on('close', () => process.exit(0));
