// Reference token ids for tests/text: the Hugging Face `tokenizers` library (Rust, through the
// @anush008/tokenizers Node binding, tokenizers 0.22) encodes texts read as JSON strings, one per
// line, and prints one line of space-separated ids per text ("ERROR <message>" when it fails).
//
//   node tok_oracle.js [--vocab-txt --lowercase 0|1] [--max N] [--types] [--bench N] [--save OUT.json] TOKENIZER TEXTS.jsonl
//
// --vocab-txt builds BERT's pipeline around a vocab.txt (BertNormalizer, BertPreTokenizer,
// WordPiece, [CLS] ... [SEP], truncation at 512) as transformers' BertTokenizerFast does;
// --save writes that pipeline as a tokenizer.json. --bench N encodes everything N more times
// (encodeBatch) and prints tokens per second to stderr.
'use strict';
const fs = require('fs');
const tk = require('@anush008/tokenizers');

async function main() {
  const a = process.argv.slice(2);
  let vocabTxt = false, lowercase = true, max = 0, types = false, bench = 0, save = null;
  while (a.length && a[0].startsWith('--')) {
    const o = a.shift();
    if (o === '--vocab-txt') vocabTxt = true;
    else if (o === '--lowercase') lowercase = a.shift() !== '0';
    else if (o === '--max') max = parseInt(a.shift(), 10);
    else if (o === '--types') types = true;
    else if (o === '--bench') bench = parseInt(a.shift(), 10);
    else if (o === '--save') save = a.shift();
    else throw new Error('unknown option ' + o);
  }
  if (a.length !== 2) throw new Error('usage: tok_oracle.js [options] TOKENIZER TEXTS.jsonl');
  let tok;
  if (vocabTxt) {
    const lines = fs.readFileSync(a[0], 'utf8').split('\n');
    const id = (t) => { const i = lines.findIndex((l) => l.trimEnd() === t); if (i < 0) throw new Error('no ' + t); return i; };
    const model = await tk.WordPiece.fromFile(a[0], { unkToken: '[UNK]' });
    tok = new tk.Tokenizer(model);
    tok.setNormalizer(tk.bertNormalizer({ cleanText: true, handleChineseChars: true, lowercase }));
    tok.setPreTokenizer(tk.bertPreTokenizer());
    tok.setPostProcessor(tk.bertProcessing(['[SEP]', id('[SEP]')], ['[CLS]', id('[CLS]')]));
    tok.setTruncation(512);
    // as transformers' BertTokenizerFast: the special tokens are matched in the text
    tok.addSpecialTokens(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'].filter((t) => lines.some((l) => l.trimEnd() === t)));
    if (save) tok.save(save, true);
  } else {
    tok = tk.Tokenizer.fromFile(a[0]);
  }
  if (max > 0) tok.setTruncation(max);
  const texts = fs.readFileSync(a[1], 'utf8').split('\n').filter((l) => l.length).map((l) => JSON.parse(l));
  const out = [];
  for (const t of texts) {
    try {
      const e = await tok.encode(t);
      let line = e.getIds().join(' ');
      if (types) line += ' | ' + e.getTypeIds().join(' ');
      out.push(line);
    } catch (err) {
      out.push('ERROR ' + String(err.message || err).split('\n')[0]);
    }
  }
  process.stdout.write(out.join('\n') + (out.length ? '\n' : ''));
  if (bench > 0) {
    let tokens = 0;
    const t0 = process.hrtime.bigint();
    for (let r = 0; r < bench; r++) {
      for (let i = 0; i < texts.length; i += 64) {
        const es = await tok.encodeBatch(texts.slice(i, i + 64));
        for (const e of es) tokens += e.getIds().length;
      }
    }
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    process.stderr.write(`bench: ${texts.length} texts x ${bench}, ${tokens} tokens in ${dt.toFixed(3)} s: ` +
      `${Math.round(tokens / dt)} tokens/s (encodeBatch of 64, library threads), ${(dt * 1e6 / (texts.length * bench)).toFixed(1)} us/text\n`);
    let t1 = process.hrtime.bigint(); tokens = 0;
    for (const t of texts) tokens += (await tok.encode(t)).getIds().length;
    const d1 = Number(process.hrtime.bigint() - t1) / 1e9;
    process.stderr.write(`bench: one at a time: ${Math.round(tokens / d1)} tokens/s, ${(d1 * 1e6 / texts.length).toFixed(1)} us/text\n`);
  }
}
main().catch((e) => { console.error('tok_oracle: ' + (e.stack || e)); process.exit(1); });
