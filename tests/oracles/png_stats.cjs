#!/usr/bin/env node
// tests/oracles/png_stats.cjs - decode an 8-bit RGB/RGBA PNG (node's zlib only) and print JSON stats:
// {"width", "height", "colors": distinct RGB values, "has": {"#rrggbb": pixel count, ...}} for
// the colours given as arguments (exact match). Used by tests/e2e/e2e_report.sh on a screenshot.
//   node png_stats.cjs FILE.png [#rrggbb ...]
'use strict';
const fs = require('fs');
const zlib = require('zlib');

const buf = fs.readFileSync(process.argv[2]);
const sig = '89504e470d0a1a0a';
if (buf.subarray(0, 8).toString('hex') !== sig) {
  console.error('png_stats: not a PNG');
  process.exit(1);
}
let pos = 8, width = 0, height = 0, depth = 0, ctype = 0, interlace = 0;
const idat = [];
while (pos < buf.length) {
  const len = buf.readUInt32BE(pos);
  const type = buf.toString('ascii', pos + 4, pos + 8);
  const data = buf.subarray(pos + 8, pos + 8 + len);
  if (type === 'IHDR') {
    width = data.readUInt32BE(0);
    height = data.readUInt32BE(4);
    depth = data[8];
    ctype = data[9];
    interlace = data[12];
  } else if (type === 'IDAT') {
    idat.push(data);
  } else if (type === 'IEND') {
    break;
  }
  pos += 12 + len;
}
const bpp = ctype === 6 ? 4 : ctype === 2 ? 3 : 0;
if (depth !== 8 || !bpp || interlace) {
  console.error(`png_stats: unsupported PNG (depth ${depth}, color type ${ctype}, interlace ${interlace})`);
  process.exit(1);
}
const raw = zlib.inflateSync(Buffer.concat(idat));
const stride = width * bpp;
const img = Buffer.alloc(stride * height);
// Undo the per-row filters (PNG spec: None, Sub, Up, Average, Paeth).
for (let y = 0; y < height; y++) {
  const f = raw[y * (stride + 1)];
  const src = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1));
  const row = img.subarray(y * stride, (y + 1) * stride);
  const up = y ? img.subarray((y - 1) * stride, y * stride) : null;
  for (let x = 0; x < stride; x++) {
    const a = x >= bpp ? row[x - bpp] : 0;
    const b = up ? up[x] : 0;
    const c = up && x >= bpp ? up[x - bpp] : 0;
    let v = src[x];
    if (f === 1) v += a;
    else if (f === 2) v += b;
    else if (f === 3) v += (a + b) >> 1;
    else if (f === 4) {
      const p = a + b - c, pa = Math.abs(p - a), pb = Math.abs(p - b), pc = Math.abs(p - c);
      v += pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
    }
    row[x] = v & 255;
  }
}
const want = process.argv.slice(3).map((h) => h.toLowerCase());
const has = Object.fromEntries(want.map((h) => [h, 0]));
const seen = new Set();
for (let i = 0; i < img.length; i += bpp) {
  const key = (img[i] << 16) | (img[i + 1] << 8) | img[i + 2];
  seen.add(key);
  const hex = '#' + key.toString(16).padStart(6, '0');
  if (hex in has) has[hex]++;
}
console.log(JSON.stringify({ width, height, colors: seen.size, has }));
