#!/usr/bin/env node
// Builds the web console (docs/console.md) into dist/ui: ui/src/main.ts bundled and minified by
// esbuild (Preact and htm inside, nothing loaded from elsewhere at run time), ui/index.html and
// ui/style.css copied, and a Brotli and a gzip copy of each file written beside it, which the
// agent serves to a browser that takes them (src/api/routes/console.ts).
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { brotliCompressSync, constants, gzipSync } from 'node:zlib';
import { build } from 'esbuild';

const OUT = 'dist/ui';
rmSync(OUT, { recursive: true, force: true });
mkdirSync(OUT, { recursive: true });
const result = await build({
  entryPoints: ['ui/src/main.ts'],
  bundle: true,
  minify: true,
  format: 'esm',
  target: ['es2022'],
  outfile: join(OUT, 'app.js'),
  legalComments: 'none',
  write: false,
  logLevel: 'warning',
});
writeFileSync(join(OUT, 'app.js'), result.outputFiles[0].contents);
for (const name of ['index.html', 'style.css'])
  writeFileSync(join(OUT, name), readFileSync(join('ui', name)));
const sizes = [];
for (const name of ['index.html', 'app.js', 'style.css']) {
  const raw = readFileSync(join(OUT, name));
  const br = brotliCompressSync(raw, { params: { [constants.BROTLI_PARAM_QUALITY]: 11 } });
  writeFileSync(join(OUT, `${name}.br`), br);
  writeFileSync(join(OUT, `${name}.gz`), gzipSync(raw, { level: 9 }));
  sizes.push(`${name} ${raw.length} B (br ${br.length} B)`);
}
console.error(`build-ui: ${sizes.join(', ')}`);
