#!/usr/bin/env node
// ONNX Runtime throughput benchmark (the baseline for `make bench`): loads a
// model with onnxruntime-node (CPU, graphOptimizationLevel 'all', sequential,
// intraOpNumThreads T, interOpNumThreads 1), feeds random inputs built from the
// model's input metadata (first symbolic dim = batch, other symbolic dims from
// --dim or 1; floats uniform [0,1), integers 0/1), does one warm-up run, then
// times runs until both --iters K and --min-seconds S are reached (at most 200)
// and prints one JSON line: {"median_ms", "throughput_per_s", "iters", "load_ms"}.
//
// usage: node tools/ort/ort_bench.js MODEL.onnx [--batch N] [--threads T] [--iters K]
//            [--min-seconds S] [--dim NAME=V ...] [--shape INPUT=d0,d1,... ...]
//            [--input NAME=FILE.npy ...]
// --shape overrides an input's whole shape (for builds whose metadata lacks shapes);
// --input feeds an input from a .npy file instead (a model whose inputs select a branch,
// such as a sample rate, needs real values).
'use strict';

const fs = require('fs');
const { readNpy } = require('./ort_run.js');

const MAX_ITERS = 200;

function fail(msg, code = 1) {
  console.error('ort_bench: ' + msg);
  process.exit(code);
}

let ort;
try {
  ort = require('onnxruntime-node');
} catch (e) {
  fail('cannot load onnxruntime-node (npm install in tools/ort?): ' + e.message, 2);
}

function usage() {
  console.error('usage: node ort_bench.js MODEL.onnx [--batch N] [--threads T] [--iters K] ' +
    '[--min-seconds S] [--dim NAME=V ...] [--shape INPUT=d0,d1,... ...] [--input NAME=FILE.npy ...]');
  process.exit(2);
}

function parseArgs(argv) {
  const o = { model: null, batch: 1, threads: 1, iters: 5, minSeconds: 2, dims: {}, shapes: {}, inputs: {} };
  const posInt = (name, v) => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < 1) fail(`${name} wants a positive integer, got '${v}'`, 2);
    return n;
  };
  for (let i = 0; i < argv.length; i++) {
    let a = argv[i];
    let val = null;
    const eq = a.indexOf('=');
    if (a.startsWith('--') && eq > 0) {
      val = a.slice(eq + 1);
      a = a.slice(0, eq);
    }
    const next = () => {
      if (val !== null) return val;
      if (i + 1 >= argv.length) fail(`${a} needs a value`, 2);
      return argv[++i];
    };
    switch (a) {
      case '--batch': o.batch = posInt(a, next()); break;
      case '--threads': o.threads = posInt(a, next()); break;
      case '--iters': o.iters = posInt(a, next()); break;
      case '--min-seconds': {
        const v = next();
        o.minSeconds = Number(v);
        if (!Number.isFinite(o.minSeconds) || o.minSeconds < 0) fail(`--min-seconds wants a number >= 0, got '${v}'`, 2);
        break;
      }
      case '--dim': {
        const v = next();
        const m = v.match(/^([^=]+)=(\d+)$/);
        if (!m || Number(m[2]) < 1) fail(`bad --dim '${v}' (want NAME=VALUE)`, 2);
        o.dims[m[1]] = Number(m[2]);
        break;
      }
      case '--shape': {
        const v = next();
        const k = v.lastIndexOf('=');
        if (k <= 0) fail(`bad --shape '${v}' (want INPUT=d0,d1,...)`, 2);
        const dims = v.slice(k + 1).split(',').map((s) => Number(s.trim()));
        if (dims.some((d) => !Number.isInteger(d) || d < 0)) fail(`bad --shape '${v}'`, 2);
        o.shapes[v.slice(0, k)] = dims;
        break;
      }
      case '--input': {
        const v = next();
        const k = v.indexOf('=');
        if (k <= 0) fail(`bad --input '${v}' (want NAME=FILE.npy)`, 2);
        o.inputs[v.slice(0, k)] = v.slice(k + 1);
        break;
      }
      case '-h': case '--help': usage(); break;
      default:
        if (a.startsWith('-')) fail(`unknown option '${a}'`, 2);
        if (o.model) fail(`unexpected argument '${a}'`, 2);
        o.model = a;
    }
  }
  if (!o.model) usage();
  return o;
}

// Random tensor of the given ORT type and shape (floats [0,1), integers 0/1).
function randomTensor(type, shape) {
  const n = shape.reduce((a, b) => a * b, 1);
  switch (type) {
    case 'float32': { const d = new Float32Array(n); for (let i = 0; i < n; i++) d[i] = Math.random(); return new ort.Tensor(type, d, shape); }
    case 'float64': { const d = new Float64Array(n); for (let i = 0; i < n; i++) d[i] = Math.random(); return new ort.Tensor(type, d, shape); }
    case 'int64': { const d = new BigInt64Array(n); for (let i = 0; i < n; i++) d[i] = Math.random() < 0.5 ? 0n : 1n; return new ort.Tensor(type, d, shape); }
    case 'uint64': { const d = new BigUint64Array(n); for (let i = 0; i < n; i++) d[i] = Math.random() < 0.5 ? 0n : 1n; return new ort.Tensor(type, d, shape); }
    case 'int32': case 'uint32': case 'int16': case 'uint16': case 'int8': case 'uint8': case 'bool': {
      const C = { int32: Int32Array, uint32: Uint32Array, int16: Int16Array, uint16: Uint16Array, int8: Int8Array, uint8: Uint8Array, bool: Uint8Array }[type];
      const d = new C(n);
      for (let i = 0; i < n; i++) d[i] = Math.random() < 0.5 ? 0 : 1;
      return new ort.Tensor(type, d, shape);
    }
    default: fail(`unsupported input type '${type}'`);
  }
  return null;
}

function buildFeeds(session, o) {
  const meta = session.inputMetadata;
  const feeds = {};
  for (const name of Object.keys(o.shapes)) if (!session.inputNames.includes(name)) fail(`--shape: model has no input '${name}'`, 2);
  for (const name of Object.keys(o.inputs)) {
    if (!session.inputNames.includes(name)) fail(`--input: model has no input '${name}'`, 2);
    feeds[name] = readNpy(o.inputs[name]);
  }
  for (let idx = 0; idx < session.inputNames.length; idx++) {
    const name = session.inputNames[idx];
    if (name in feeds) continue; /* given with --input */
    const m = Array.isArray(meta) ? meta.find((x) => x.name === name) || meta[idx] : null;
    if (m && m.isTensor === false) fail(`input '${name}' is not a tensor`);
    const type = (m && m.type) || 'float32';
    let shape = o.shapes[name];
    if (!shape) {
      if (!m || !Array.isArray(m.shape)) fail(`no shape metadata for input '${name}'; pass --shape ${name}=d0,d1,...`, 2);
      let sawSymbolic = false;
      shape = m.shape.map((d) => {
        if (typeof d === 'number' && d >= 0) return d;
        // symbolic (string) or unknown (-1 / null) dimension
        if (!sawSymbolic) { sawSymbolic = true; return o.batch; }
        if (typeof d === 'string' && d in o.dims) return o.dims[d];
        return 1;
      });
    }
    feeds[name] = randomTensor(type, shape);
  }
  return feeds;
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  if (!fs.existsSync(o.model)) fail(`model not found: ${o.model}`, 2);
  const t0 = process.hrtime.bigint();
  let session;
  try {
    session = await ort.InferenceSession.create(o.model, {
      graphOptimizationLevel: 'all',
      intraOpNumThreads: o.threads,
      interOpNumThreads: 1,
      executionMode: 'sequential',
      executionProviders: ['cpu'],
    });
  } catch (e) {
    fail(`cannot load ${o.model}: ${e.message}`);
  }
  const loadMs = Number(process.hrtime.bigint() - t0) / 1e6;
  const feeds = buildFeeds(session, o);
  const run = async () => {
    try {
      await session.run(feeds);
    } catch (e) {
      fail(`run failed: ${e.message}`);
    }
  };
  await run(); // warm-up
  const times = [];
  const start = process.hrtime.bigint();
  for (;;) {
    const a = process.hrtime.bigint();
    await run();
    const b = process.hrtime.bigint();
    times.push(Number(b - a) / 1e6);
    const elapsed = Number(b - start) / 1e9;
    if (times.length >= MAX_ITERS) break;
    if (times.length >= o.iters && elapsed >= o.minSeconds) break;
  }
  const s = times.slice().sort((x, y) => x - y);
  const mid = s.length >> 1;
  const median = s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
  const r = (x, d) => Number(x.toFixed(d));
  console.log(JSON.stringify({
    median_ms: r(median, 3),
    throughput_per_s: r((o.batch * 1000) / median, 3),
    iters: times.length,
    load_ms: r(loadMs, 2),
  }));
  if (typeof session.release === 'function') await session.release();
}

main().catch((e) => fail(e && e.stack ? e.stack : String(e)));
