#!/usr/bin/env node
// Reference runner for models with string tensors, which .npy files (ort_run.js) cannot carry:
// runs MODEL.onnx with onnxruntime-node (CPU) on inputs given as one JSON object on stdin,
//   {"NAME": {"type": "string" | "float32" | "int64" | ..., "dims": [..], "data": [..]}, ...}
// and prints every output as one JSON object of the same form on stdout (int64 values as
// numbers; NaN and infinities of float outputs as the strings "NaN", "Infinity", "-Infinity").
// Exits non-zero with a message on any error.
//
// usage: node tools/ort/ort_strings.js MODEL.onnx < inputs.json
'use strict';

const fs = require('fs');

let ort;
try {
  ort = require('onnxruntime-node');
} catch (e) {
  console.error('ort_strings: cannot load onnxruntime-node (npm install in tools/ort?): ' + e.message);
  process.exit(2);
}

const ARRAYS = {
  float32: Float32Array, float64: Float64Array, int32: Int32Array, int8: Int8Array, uint8: Uint8Array,
  int64: BigInt64Array,
};

function tensorOf(name, spec) {
  const { type, dims, data } = spec;
  if (type === 'string') return new ort.Tensor('string', data.map(String), dims);
  const Arr = ARRAYS[type];
  if (!Arr) throw new Error(`input ${name}: unsupported type ${type}`);
  const values = type === 'int64' ? data.map((v) => BigInt(v)) : data;
  return new ort.Tensor(type, Arr.from(values), dims);
}

async function main() {
  if (process.argv.length !== 3) {
    console.error('usage: node tools/ort/ort_strings.js MODEL.onnx < inputs.json');
    process.exit(2);
  }
  const inputs = JSON.parse(fs.readFileSync(0, 'utf8'));
  const feeds = {};
  for (const [name, spec] of Object.entries(inputs)) feeds[name] = tensorOf(name, spec);
  const session = await ort.InferenceSession.create(process.argv[2], { intraOpNumThreads: 1 });
  const results = await session.run(feeds);
  const out = {};
  for (const [name, t] of Object.entries(results)) {
    // JSON has no NaN or infinity: those go as the strings "NaN", "Infinity", "-Infinity"
    const data = Array.from(t.data, (v) =>
      typeof v === 'bigint' ? Number(v) : typeof v === 'number' && !Number.isFinite(v) ? String(v) : v);
    out[name] = { type: t.type, dims: Array.from(t.dims, Number), data };
  }
  process.stdout.write(JSON.stringify(out) + '\n');
}

main().catch((e) => {
  console.error('ort_strings: ' + (e && e.message ? e.message : String(e)));
  process.exit(1);
});
