/**
 * bench/transports/kcp-seal: what the kcp transport's encryption layer (src/transports/kcp/
 * secure-datagram.ts) costs per datagram, against node:crypto's AEAD alone in the same run
 * (`node dist/bench/transports/kcp-seal.js`; not part of the tests). One process, one core.
 *
 * Every variant handles BENCH_MB (32) MB of 1200-byte datagrams, one at a time, in order (KCP's
 * datagrams are about that size: mtu 1350):
 * - session seal+open: SecureSession.seal() + .open(): framing (13-byte header as AAD), the
 *   counter, the replay window, the copy into one datagram buffer;
 * - endpoint seal+receive: SecureEndpoint.seal(peer) + .receive() (index lookup, counters, rotation
 *   check) on top of the session;
 * - session seal, open, alone;
 * - AES-128-GCM and ChaCha20-Poly1305 baselines, for the choice of cipher.
 * Each is run right next to its baseline, node:crypto alone with a fresh cipher per datagram (the
 * only way node:crypto takes a new nonce, and what the session itself did before it sealed through
 * src/native/aead.ts): createCipheriv + update + final + getAuthTag (seal), createDecipheriv +
 * setAuthTag + update + final (open) of the same bytes: no header, no AAD, no window, no copy. The
 * two alternate in order over BENCH_ROUNDS (7) rounds and the ratio is the median of the per-round
 * ratios (with its range): neighbours on this machine move absolute figures by tens of percent.
 * Figures are MB per CPU-second of this process (the whole loop runs on its one thread).
 * The ratio that matters: session seal+open / baseline AES-256-GCM seal+open. Then handshakes per
 * second (INIT, RESPONSE, completion; each includes X25519 key generation, signing, verifying).
 * Output: a table on stdout and JSON in bench/results/kcp-seal-<timestamp>.json (git-ignored).
 */
import {
  type CipherGCMTypes,
  createCipheriv,
  createDecipheriv,
  generateKeyPairSync,
  randomBytes,
} from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { peerIdFromPublicKey } from '../../src/domain/ids.js';
import {
  completeInit,
  createInit,
  HandshakeResponder,
  type Identity,
  identityFromPrivateKey,
  SecureEndpoint,
  SecureSession,
} from '../../src/transports/kcp/secure-datagram.js';

const MB = Number(process.env['BENCH_MB'] ?? 32);
const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 7);
const SIZE = 1200;
const COUNT = Math.ceil((MB * 1e6) / SIZE);
const HANDSHAKES = Number(process.env['BENCH_HANDSHAKES'] ?? 300);

const payload = randomBytes(SIZE);

/**
 * MB of plaintext per second of this process's CPU time (user + system) through `run`, which
 * handles COUNT datagrams. CPU time rather than wall time: the work is all on this thread, and
 * other processes on the machine take wall time from it but not CPU time.
 */
function throughput(run: () => void): number {
  const t0 = process.cpuUsage();
  run();
  const cpu = process.cpuUsage(t0);
  return (COUNT * SIZE) / 1e6 / ((cpu.user + cpu.system) / 1e6);
}

function sessionPair(): { tx: SecureSession; rx: SecureSession } {
  const k1 = randomBytes(32);
  const k2 = randomBytes(32);
  const common = { role: 'initiator' as const, createdMs: Date.now() };
  return {
    tx: new SecureSession({ ...common, localIndex: 1, remoteIndex: 2, sendKey: k1, receiveKey: k2 }),
    rx: new SecureSession({ ...common, localIndex: 2, remoteIndex: 1, sendKey: k2, receiveKey: k1 }),
  };
}

function identity(): Identity & { id: string } {
  const id = identityFromPrivateKey(generateKeyPairSync('ed25519').privateKey);
  return { ...id, id: peerIdFromPublicKey(id.publicKeyRaw) };
}

function ordered(): [Identity & { id: string }, Identity & { id: string }] {
  const a = identity();
  const b = identity();
  return a.id < b.id ? [a, b] : [b, a];
}

function session(): number {
  const { tx, rx } = sessionPair();
  return throughput(() => {
    for (let i = 0; i < COUNT; i++) {
      const opened = rx.open(tx.seal(payload));
      if (typeof opened === 'string') throw new Error(`open: ${opened}`);
    }
  });
}

function sessionSealOnly(): number {
  const { tx } = sessionPair();
  return throughput(() => {
    for (let i = 0; i < COUNT; i++) tx.seal(payload);
  });
}

function sessionOpenOnly(): number {
  const { tx, rx } = sessionPair();
  const sealed = Array.from({ length: COUNT }, () => tx.seal(payload));
  return throughput(() => {
    for (const d of sealed) if (typeof rx.open(d) === 'string') throw new Error('open failed');
  });
}

function endpoint(): number {
  const [a, b] = ordered();
  const byKey = new Map([a, b].map((p) => [p.publicKeyRaw.toString('hex'), { id: p.id }]));
  const peerByKey = (raw: Buffer) => byKey.get(raw.toString('hex'));
  const A = new SecureEndpoint({ self: a, peerByKey });
  const B = new SecureEndpoint({ self: b, peerByKey });
  const now = Date.now();
  const reply = B.receive(A.initiate(b.id, b.publicKeyRaw, now), '127.0.0.1', now);
  if (reply.kind !== 'reply') throw new Error(`handshake: ${JSON.stringify(reply)}`);
  if (A.receive(reply.datagram, '127.0.0.1', now).kind !== 'established') throw new Error('not established');
  return throughput(() => {
    for (let i = 0; i < COUNT; i++) {
      const r = B.receive(A.seal(b.id, payload)!, '127.0.0.1', now);
      if (r.kind !== 'data') throw new Error(`receive: ${JSON.stringify(r)}`);
    }
  });
}

/** node:crypto alone: a fresh cipher per datagram (as the session must), nonce from a counter. */
function baseline(algorithm: CipherGCMTypes | 'chacha20-poly1305', keyBytes: number): number {
  const key = randomBytes(keyBytes);
  const nonce = Buffer.alloc(12);
  return throughput(() => {
    for (let i = 0; i < COUNT; i++) {
      nonce.writeUInt32BE(i, 8);
      const cipher = createCipheriv(algorithm as CipherGCMTypes, key, nonce, { authTagLength: 16 });
      const ciphertext = cipher.update(payload);
      cipher.final();
      const tag = cipher.getAuthTag();
      const decipher = createDecipheriv(algorithm as CipherGCMTypes, key, nonce, { authTagLength: 16 });
      decipher.setAuthTag(tag);
      decipher.update(ciphertext);
      decipher.final();
    }
  });
}

function baselineSealOnly(): number {
  const key = randomBytes(32);
  const nonce = Buffer.alloc(12);
  return throughput(() => {
    for (let i = 0; i < COUNT; i++) {
      nonce.writeUInt32BE(i, 8);
      const cipher = createCipheriv('aes-256-gcm', key, nonce, { authTagLength: 16 });
      cipher.update(payload);
      cipher.final();
      cipher.getAuthTag();
    }
  });
}

function baselineOpenOnly(): number {
  const key = randomBytes(32);
  const nonce = Buffer.alloc(12);
  const sealed = Array.from({ length: COUNT }, (_, i) => {
    nonce.writeUInt32BE(i, 8);
    const cipher = createCipheriv('aes-256-gcm', key, nonce, { authTagLength: 16 });
    const ciphertext = cipher.update(payload);
    cipher.final();
    return { ciphertext, tag: cipher.getAuthTag() };
  });
  return throughput(() => {
    for (let i = 0; i < COUNT; i++) {
      nonce.writeUInt32BE(i, 8);
      const decipher = createDecipheriv('aes-256-gcm', key, nonce, { authTagLength: 16 });
      decipher.setAuthTag(sealed[i]!.tag);
      decipher.update(sealed[i]!.ciphertext);
      decipher.final();
    }
  });
}

/** Handshakes per second, each step timed on its own over HANDSHAKES handshakes. */
function handshakes(): Record<string, number> {
  const [a, b] = ordered();
  const byKey = new Map([[a.publicKeyRaw.toString('hex'), { id: a.id }]]);
  const responder = new HandshakeResponder({
    self: b,
    peerByKey: (raw) => byKey.get(raw.toString('hex')),
    limits: { perAddressPerSecond: 1e9, perAddressBurst: 1e9, globalPerSecond: 1e9, globalBurst: 1e9 },
  });
  const now = Date.now();
  let t = performance.now();
  const inits = Array.from({ length: HANDSHAKES }, (_, i) => createInit(a, b.publicKeyRaw, now + i));
  const initMs = performance.now() - t;
  t = performance.now();
  const responses = inits.map(({ datagram }) => {
    const r = responder.respond(datagram, '127.0.0.1', now);
    if (!r.ok) throw new Error(`respond: ${r.reason}`);
    return r.datagram;
  });
  const respondMs = performance.now() - t;
  t = performance.now();
  inits.forEach(({ pending }, i) => {
    if (!completeInit(pending, responses[i]!, now).ok) throw new Error('complete');
  });
  const completeMs = performance.now() - t;
  const perSecond = (ms: number) => (HANDSHAKES * 1000) / ms;
  return {
    'createInit /s': perSecond(initMs),
    'respond /s': perSecond(respondMs),
    'completeInit /s': perSecond(completeMs),
    'whole handshakes /s (one core, both ends)': perSecond(initMs + respondMs + completeMs),
  };
}

function median(xs: number[]): number {
  return [...xs].sort((x, y) => x - y)[xs.length >> 1]!;
}

interface PairFigure {
  mbPerSecond: number;
  baselineMbPerSecond: number;
  /** Median of the per-round ratios (each from two runs back to back). */
  ratio: number;
  ratioMin: number;
  ratioMax: number;
}

async function main(): Promise<void> {
  const aes256 = () => baseline('aes-256-gcm', 32);
  // Each variant is measured right next to its baseline, in alternating order, and the ratio is
  // taken per round: this machine's neighbours move absolute figures by tens of percent.
  const pairs: [string, () => number, string, () => number][] = [
    ['session seal+open', session, 'baseline AES-256-GCM seal+open', aes256],
    ['endpoint seal+receive', endpoint, 'baseline AES-256-GCM seal+open', aes256],
    ['session seal', sessionSealOnly, 'baseline AES-256-GCM seal', baselineSealOnly],
    ['session open', sessionOpenOnly, 'baseline AES-256-GCM open', baselineOpenOnly],
    [
      'baseline AES-128-GCM seal+open',
      () => baseline('aes-128-gcm', 16),
      'baseline AES-256-GCM seal+open',
      aes256,
    ],
    [
      'baseline ChaCha20-Poly1305 seal+open',
      () => baseline('chacha20-poly1305', 32),
      'baseline AES-256-GCM seal+open',
      aes256,
    ],
  ];
  console.log(
    `${MB} MB of ${SIZE}-byte datagrams per figure (${COUNT}), ${ROUNDS} rounds, each variant next to its baseline`,
  );
  const results: Record<string, PairFigure> = {};
  for (const [name, run, baseName, runBase] of pairs) {
    const a: number[] = [];
    const b: number[] = [];
    const ratios: number[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      let x: number;
      let y: number;
      if (r % 2 === 0) {
        x = run();
        y = runBase();
      } else {
        y = runBase();
        x = run();
      }
      a.push(x);
      b.push(y);
      ratios.push(x / y);
    }
    const figure: PairFigure = {
      mbPerSecond: median(a),
      baselineMbPerSecond: median(b),
      ratio: median(ratios),
      ratioMin: Math.min(...ratios),
      ratioMax: Math.max(...ratios),
    };
    results[name] = figure;
    const us = (mbps: number) => ((SIZE / (mbps * 1e6)) * 1e6).toFixed(2);
    console.log(
      `${name.padEnd(38)} ${figure.mbPerSecond.toFixed(1).padStart(6)} MB/s (${us(figure.mbPerSecond)} µs)  ` +
        `${baseName} ${figure.baselineMbPerSecond.toFixed(1)} MB/s (${us(figure.baselineMbPerSecond)} µs)  ` +
        `ratio ${figure.ratio.toFixed(3)} [${figure.ratioMin.toFixed(2)}..${figure.ratioMax.toFixed(2)}]`,
    );
  }
  const hs = handshakes();
  for (const [name, n] of Object.entries(hs)) console.log(`${name.padEnd(44)} ${n.toFixed(0).padStart(7)}`);
  const dir = fileURLToPath(new URL('../../../bench/results/', import.meta.url));
  mkdirSync(dir, { recursive: true });
  const stamp = new Date().toISOString().replace(/[-:]/g, '').replace(/\.\d+/, '');
  writeFileSync(
    `${dir}kcp-seal-${stamp}.json`,
    JSON.stringify({ MB, ROUNDS, SIZE, COUNT, results, handshakes: hs }, null, 2),
  );
}

await main();
