/**
 * Loads one of this package's native addons (build/Release/<name>.node, built by `npm install`
 * through node-gyp) by the package root, wherever the calling module sits (src/native/ from
 * source, dist/src/native/ when built). Used by the wrappers in src/native; Node built-ins only.
 */
import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The directory of this package's package.json. */
function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const manifest = join(dir, 'package.json');
    if (
      existsSync(manifest) &&
      (JSON.parse(readFileSync(manifest, 'utf8')) as { name?: string }).name === 'mesh-agent'
    )
      return dir;
    const parent = dirname(dir);
    if (parent === dir)
      throw new Error('mesh-agent package root not found above ' + fileURLToPath(import.meta.url));
    dir = parent;
  }
}

/** Requires build/Release/<file>; the error names the file and how to build it. */
export function loadAddon<T>(file: string): T {
  const root = packageRoot();
  const path = `build/Release/${file}`;
  try {
    return createRequire(join(root, 'package.json'))(`./${path}`) as T;
  } catch (e) {
    throw new Error(
      `cannot load the native addon ${join(root, path)} (build it with npm install, or node-gyp rebuild): ${(e as Error).message}`,
      { cause: e },
    );
  }
}
