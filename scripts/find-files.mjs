// The files under a directory whose names end with a suffix: the test scripts' one directory walk.
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';

export function findFiles(dir, suffix, out = []) {
  for (const name of readdirSync(dir)) {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) findFiles(path, suffix, out);
    else if (name.endsWith(suffix)) out.push(path);
  }
  return out;
}
