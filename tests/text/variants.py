"""Pipeline variants for the tokenizer oracle test: tokenizer.json documents built from the real
vocabularies (BERT WordPiece, GPT-2 byte-level BPE, the 32k byte-fallback BPE) with other
normalizers, pre-tokenizers, post-processors and truncation settings, so that every implemented
step is compared with the reference library, which loads the same documents.

usage: variants.py BERT.json GPT2.json LLAMA.json OUTDIR [LLAMA3.json]   (writes OUTDIR/<name>.json)
"""
import copy
import json
import os
import sys


GPT2_RE = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"


QWEN2_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
            "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def variants(bert, gpt2, llama, llama3=None):
    out = {}
    def v(name, base, **kw):
        d = copy.deepcopy(base)
        d.update(kw)
        out[name] = d
    tmpl = {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 1}},
                       {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [101], "tokens": ["[CLS]"]},
                               "[SEP]": {"id": "[SEP]", "ids": [102], "tokens": ["[SEP]"]}}}
    v("wp_whitespace", bert, normalizer={"type": "Sequence", "normalizers": [
        {"type": "NFD"}, {"type": "Lowercase"}, {"type": "StripAccents"}, {"type": "Strip", "strip_left": True, "strip_right": True}]},
      pre_tokenizer={"type": "Whitespace"}, post_processor=tmpl)
    v("wp_punct_digits", bert, normalizer={"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": False,
                                           "strip_accents": True, "lowercase": False},
      pre_tokenizer={"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"},
                                                            {"type": "Punctuation", "behavior": "Contiguous"},
                                                            {"type": "Digits", "individual_digits": True}]})
    v("wp_chardelim_left", bert, normalizer={"type": "Lowercase"},
      pre_tokenizer={"type": "Sequence", "pretokenizers": [{"type": "CharDelimiterSplit", "delimiter": " "},
                                                            {"type": "Punctuation", "behavior": "MergedWithPrevious"},
                                                            {"type": "Digits", "individual_digits": False}]},
      truncation={"direction": "Left", "max_length": 20, "strategy": "LongestFirst", "stride": 0})
    v("bpe_gpt2_split_roberta", gpt2, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": GPT2_RE}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": False}]},
      post_processor={"type": "RobertaProcessing", "sep": ["<|endoftext|>", 50256], "cls": ["<|endoftext|>", 50256],
                      "trim_offsets": True, "add_prefix_space": True})
    v("bpe_metaspace_first", llama, normalizer={"type": "Replace", "pattern": {"String": "\t"}, "content": " "},
      pre_tokenizer={"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True})
    v("bpe_metaspace_always_nosplit", llama, normalizer={"type": "Sequence", "normalizers": [
        {"type": "Strip", "strip_left": True, "strip_right": False}, {"type": "Prepend", "prepend": "\u2581"}]},
      pre_tokenizer={"type": "Sequence", "pretokenizers": [
          {"type": "Split", "pattern": {"String": "-"}, "behavior": "MergedWithNext", "invert": False},
          {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": False}]})
    # Unigram over the 32k vocabulary with made-up scores (no real Unigram tokenizer.json was
    # found on npm): deterministic, spread over [-17, -1], so Viterbi has real choices to make.
    # They are multiples of 1/64, exact in binary: the reference reads JSON numbers with
    # serde_json's fast float parser, which can be one unit in the last place off the correctly
    # rounded value this project's parser gives, and that would decide exact ties differently.
    toks = sorted(llama["model"]["vocab"].items(), key=lambda kv: kv[1])
    uvocab = [[tok, -1.0 - ((i * 2654435761) % 1024) / 64.0] for tok, i in toks]
    uni = {"type": "Unigram", "unk_id": 0, "vocab": uvocab, "byte_fallback": True}
    v("unigram_bytefallback", llama, model=uni)
    uni2 = dict(uni, byte_fallback=False)
    v("unigram_metaspace_fuse_unk", llama, model=uni2, normalizer={"type": "NFD"},
      pre_tokenizer={"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True})
    # the other Unicode normalization forms, over BERT's vocabulary (cased pipeline)
    for form in ("NFC", "NFKC", "NFKD"):
        v("wp_" + form.lower(), bert, normalizer={"type": "Sequence", "normalizers": [{"type": form}]},
          pre_tokenizer={"type": "BertPreTokenizer"})
    # WordLevel: BERT's vocabulary, whole words only
    wl = {"type": "WordLevel", "vocab": bert["model"]["vocab"], "unk_token": "[UNK]"}
    v("wordlevel_whitespace", bert, model=wl, pre_tokenizer={"type": "Whitespace"})
    if llama3 is not None:
        # Qwen 2's pattern (digits one by one) over Llama 3's vocabulary
        pre = copy.deepcopy(llama3["pre_tokenizer"])
        pre["pretokenizers"][0]["pattern"] = {"Regex": QWEN2_RE}
        v("bpe_qwen2_pattern", llama3, pre_tokenizer=pre)
    return out


def write(bert_path, gpt2_path, llama_path, outdir, llama3_path=None):
    """Writes every variant; returns {name: path}."""
    docs = []
    for p in (bert_path, gpt2_path, llama_path) + ((llama3_path,) if llama3_path else ()):
        with open(p) as f:
            docs.append(json.load(f))
    paths = {}
    for name, d in variants(*docs).items():
        paths[name] = os.path.join(outdir, name + ".json")
        with open(paths[name], "w") as f:
            json.dump(d, f)
    return paths


if __name__ == "__main__":
    for name, path in write(*sys.argv[1:6]).items():
        print(name, path)
