#!/usr/bin/env node
// Reference runner: executes an ONNX model with onnxruntime-node (CPU,
// graphOptimizationLevel 'all', intraOpNumThreads 2) on inputs read from .npy
// files and writes every output to OUTDIR/<output name>.npy. The .npy v1/v2/v3
// format is parsed and written here directly (little-endian f4/f8/i8/i4/u1/b1
// and friends, C order only). Exits non-zero with a message on any error.
//
// usage: node tools/ort/ort_run.js [--opt=LEVEL] MODEL.onnx OUTDIR NAME=FILE.npy [...]
// --opt=disabled|basic|extended|all overrides the optimization level (default all).
'use strict';

const fs = require('fs');
const path = require('path');

let ort;
try {
  ort = require('onnxruntime-node');
} catch (e) {
  console.error('ort_run: cannot load onnxruntime-node (npm install in tools/ort?): ' + e.message);
  process.exit(2);
}

// npy descr (without byte order) <-> ORT tensor type <-> typed array
const DTYPES = {
  f4: { ort: 'float32', arr: Float32Array },
  f8: { ort: 'float64', arr: Float64Array },
  f2: { ort: 'float16', arr: Uint16Array },
  i8: { ort: 'int64', arr: BigInt64Array },
  u8: { ort: 'uint64', arr: BigUint64Array },
  i4: { ort: 'int32', arr: Int32Array },
  u4: { ort: 'uint32', arr: Uint32Array },
  i2: { ort: 'int16', arr: Int16Array },
  u2: { ort: 'uint16', arr: Uint16Array },
  i1: { ort: 'int8', arr: Int8Array },
  u1: { ort: 'uint8', arr: Uint8Array },
  b1: { ort: 'bool', arr: Uint8Array },
};
const ORT_TO_NPY = {};
for (const [k, v] of Object.entries(DTYPES)) ORT_TO_NPY[v.ort] = k;

function fail(msg) {
  console.error('ort_run: ' + msg);
  process.exit(1);
}

function readNpy(file) {
  let buf;
  try {
    buf = fs.readFileSync(file);
  } catch (e) {
    fail(`cannot read ${file}: ${e.message}`);
  }
  if (buf.length < 10 || buf[0] !== 0x93 || buf.toString('latin1', 1, 6) !== 'NUMPY') {
    fail(`${file}: not a .npy file`);
  }
  const major = buf[6];
  let hlen, hstart;
  if (major === 1) {
    hlen = buf.readUInt16LE(8);
    hstart = 10;
  } else if (major === 2 || major === 3) {
    hlen = buf.readUInt32LE(8);
    hstart = 12;
  } else {
    fail(`${file}: unsupported .npy version ${major}`);
  }
  const header = buf.toString('latin1', hstart, hstart + hlen);
  const descrM = header.match(/'descr'\s*:\s*'([^']*)'/);
  const fortM = header.match(/'fortran_order'\s*:\s*(True|False)/);
  const shapeM = header.match(/'shape'\s*:\s*\(([^)]*)\)/);
  if (!descrM || !fortM || !shapeM) fail(`${file}: malformed .npy header: ${header}`);
  if (fortM[1] === 'True') fail(`${file}: fortran_order arrays are not supported`);
  const descr = descrM[1];
  const order = descr[0];
  const code = descr.slice(1);
  if (!(code in DTYPES)) fail(`${file}: unsupported dtype ${descr}`);
  const itemsize = parseInt(code.slice(1), 10);
  if (order === '>' && itemsize > 1) fail(`${file}: big-endian data is not supported`);
  const shape = shapeM[1].split(',').map((s) => s.trim()).filter((s) => s.length > 0).map(Number);
  const count = shape.reduce((a, b) => a * b, 1);
  const off = hstart + hlen;
  if (buf.length - off < count * itemsize) fail(`${file}: truncated data (${buf.length - off} < ${count * itemsize} bytes)`);
  // copy into an aligned buffer
  const raw = new ArrayBuffer(count * itemsize);
  new Uint8Array(raw).set(buf.subarray(off, off + count * itemsize));
  const data = new DTYPES[code].arr(raw);
  const t = code === 'b1' ? new ort.Tensor('bool', Uint8Array.from(data), shape) : new ort.Tensor(DTYPES[code].ort, data, shape);
  return t;
}

function writeNpy(file, tensor) {
  const code = ORT_TO_NPY[tensor.type];
  if (!code) fail(`output type ${tensor.type} cannot be written as .npy`);
  const descr = (code === 'b1' || code[1] === '1' ? '|' : '<') + code;
  const dims = tensor.dims.map(Number);
  const shapeStr = dims.length === 1 ? `(${dims[0]},)` : `(${dims.join(', ')})`;
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': ${shapeStr}, }`;
  // pad so that magic(6)+ver(2)+len(2)+header is a multiple of 64, ending in '\n'
  const total = Math.ceil((10 + header.length + 1) / 64) * 64;
  header = header + ' '.repeat(total - 10 - header.length - 1) + '\n';
  const pre = Buffer.alloc(10);
  pre[0] = 0x93;
  pre.write('NUMPY', 1, 'latin1');
  pre[6] = 1;
  pre[7] = 0;
  pre.writeUInt16LE(header.length, 8);
  const d = tensor.data;
  let body;
  if (tensor.type === 'bool') body = Buffer.from(Uint8Array.from(d, (v) => (v ? 1 : 0)));
  else body = Buffer.from(d.buffer, d.byteOffset, d.byteLength);
  fs.writeFileSync(file, Buffer.concat([pre, Buffer.from(header, 'latin1'), body]));
}

async function main() {
  let optLevel = 'all';
  const args = [];
  for (const a of process.argv.slice(2)) {
    if (a.startsWith('--opt=')) {
      optLevel = a.slice(6);
      if (!['disabled', 'basic', 'extended', 'all'].includes(optLevel)) fail(`bad --opt level '${optLevel}'`);
    } else args.push(a);
  }
  if (args.length < 2) {
    console.error('usage: node ort_run.js [--opt=LEVEL] MODEL.onnx OUTDIR NAME=FILE.npy [NAME=FILE.npy ...]');
    process.exit(2);
  }
  const [modelPath, outDir, ...feedArgs] = args;
  if (!fs.existsSync(modelPath)) fail(`model not found: ${modelPath}`);
  const feeds = {};
  for (const a of feedArgs) {
    const eq = a.indexOf('=');
    if (eq <= 0) fail(`bad input argument '${a}' (want NAME=FILE.npy)`);
    feeds[a.slice(0, eq)] = readNpy(a.slice(eq + 1));
  }
  let session;
  try {
    session = await ort.InferenceSession.create(modelPath, {
      graphOptimizationLevel: optLevel,
      intraOpNumThreads: 2,
      interOpNumThreads: 1,
      executionProviders: ['cpu'],
    });
  } catch (e) {
    fail(`cannot load ${modelPath}: ${e.message}`);
  }
  for (const n of Object.keys(feeds)) if (!session.inputNames.includes(n)) fail(`model has no input '${n}' (model inputs: ${session.inputNames.join(', ')})`);
  for (const n of session.inputNames) if (!(n in feeds)) fail(`missing input '${n}' (model inputs: ${session.inputNames.join(', ')})`);
  let results;
  try {
    results = await session.run(feeds);
  } catch (e) {
    fail(`run failed: ${e.message}`);
  }
  fs.mkdirSync(outDir, { recursive: true });
  for (const name of session.outputNames) {
    const file = path.join(outDir, name.replace(/[^A-Za-z0-9_.-]/g, '_') + '.npy');
    writeNpy(file, results[name]);
  }
}

if (require.main === module) main().catch((e) => fail(e && e.stack ? e.stack : String(e)));
module.exports = { readNpy };
