/**
 * Key material in the data dir: created on first start, mode 0600, written atomically (temp
 * file, fsync, rename, fsync of the directory) so that a crash never leaves a half key behind.
 */

import { randomBytes } from 'node:crypto';
import {
  closeSync,
  fsyncSync,
  openSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeSync,
} from 'node:fs';
import { dirname, join } from 'node:path';

const TEMP_PREFIX = '.mesh-agent-';

/**
 * Removes temp files that a crash between write and rename left in `dir`. Only names this module
 * makes are touched. Returns how many were removed.
 */
export function removeStaleTempFiles(dir: string): number {
  const stale = readdirSync(dir).filter((n) => n.startsWith(TEMP_PREFIX) && n.endsWith('.tmp'));
  for (const name of stale) rmSync(join(dir, name), { force: true });
  return stale.length;
}

export function writeFileAtomic(path: string, data: string | Buffer, mode = 0o600): void {
  const tmp = join(dirname(path), `${TEMP_PREFIX}${randomBytes(6).toString('hex')}.tmp`);
  const fd = openSync(tmp, 'wx', mode);
  try {
    writeSync(fd, typeof data === 'string' ? Buffer.from(data) : data);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  renameSync(tmp, path);
  const dirFd = openSync(dirname(path), 'r');
  try {
    fsyncSync(dirFd);
  } finally {
    closeSync(dirFd);
  }
}

/**
 * Returns the file's contents, creating it with `create()` first if it does not exist.
 * Refuses a key file that others can read: a leaked key is worse than a failed start.
 */
export function loadOrCreateSecretFile(path: string, create: () => string): string {
  try {
    const mode = statSync(path).mode & 0o777;
    if ((mode & 0o077) !== 0) {
      throw new Error(`${path} has mode ${mode.toString(8)}; key files must be 0600 (chmod 600 ${path})`);
    }
    return readFileSync(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
  const contents = create();
  writeFileAtomic(path, contents, 0o600);
  return contents;
}
