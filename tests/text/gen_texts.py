#!/usr/bin/python3
"""Generates the tokenizer test texts: N varied strings (default 1,200), seeded, as JSON strings one
per line. Families: plain English, accented Latin (precomposed and combining), Greek (final
sigma), Cyrillic, Arabic, Hebrew, Devanagari, Thai, CJK (BMP and astral ideographs, kana,
Hangul), emoji (ZWJ sequences, skin tones, flags, keycaps), ASCII and Unicode punctuation runs,
whitespace oddities (NBSP, ideographic and en spaces, CR/LF/TAB runs, zero-width characters,
BOM), control characters and U+FFFD, numbers in many notations, mixed-script soup, long words
(past WordPiece's 100-character limit), long runs of one character or of combining marks, and a
few 10,000-character texts.

usage: gen_texts.py [--seed S] [--n N] OUT.jsonl
"""
import argparse
import json
import random

WORDS = ("the quick brown fox jumps over lazy dog embedding server tokenizer model batch tensor "
         "inference latency throughput memory budget eviction queue unbelievable internationalization "
         "antidisestablishmentarianism don't can't it's we'll they're o'clock e-mail state-of-the-art "
         "New York Paris London McDonald's iPhone GPU CPU HTTP/2 JSON gRPC").split()
ACCENTED = "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿÀÁÂÃÄÅÆÇÈÉÊËÌÍÎÏÑÒÓÔÕÖØÙÚÛÜÝßĀāĂăĄąĆćČčĎďĒēĖėĘęĚěĞğĪīİıŁłŃńŇňŌōŐőŒœŘřŚśŞşŠšŢţŤťŪūŮůŰűŸŹźŻżŽžǅǆǈǉ"
COMBINING = [chr(c) for c in list(range(0x300, 0x315)) + [0x323, 0x327, 0x328, 0x331, 0x345, 0x35C, 0x361]]
GREEK = "Σίσυφος ΟΔΟΣ ὁδός λόγος ΑΘΗΝΑ ἄνθρωπος Ἀθῆναι ψυχή ΣΟΦΙΑ σοφίας ΐΰ".split()
CYRILLIC = "Привет мир Ёлка ЁЖИК съёмка Україна Ґанок Ђорђе Љубав".split()
ARABIC = "مرحبا بالعالم العَرَبِيَّة ١٢٣ ٤٥٦ كتاب".split()
HEBREW = "שָׁלוֹם עולם בְּרֵאשִׁית".split()
DEVANAGARI = "नमस्ते दुनिया हिन्दी क्षत्रिय".split()
THAI = "สวัสดีชาวโลก ภาษาไทย".split()
KANA = "こんにちは カタカナ ﾊﾝｶｸ ひらがな ー〜".split()
HANGUL = "안녕하세요 세계 한국어 각".split()
CJK_BMP = [chr(c) for c in range(0x4E00, 0x9FA5)]
CJK_OTHER = [chr(c) for c in list(range(0x3400, 0x3420)) + list(range(0x20000, 0x20020)) +
             list(range(0x2A700, 0x2A710)) + list(range(0xF900, 0xF910)) + list(range(0x2F800, 0x2F810))]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🇯🇵", "1️⃣", "❤️", "🤖", "🧑🏿‍💻", "☕", "✨", "🫠", "🦀"]
ASCII_PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
UNI_PUNCT = "“”‘’«»‹›…—–‐‑‒―¡¿、。・「」『』【】〈〉《》〔〕！？，．：；·§¶†‡•‰′″‴※‼⁇⁈⁉"
SYMBOLS = "€£¥₹₩©®™°±×÷∞≈≠≤≥√∑∏∫∂∆∇∈∉∩∪⊂⊃⊕⊗→←↑↓↔⇒⇔♠♣♥♦♪♫☀☁☂★☆✓✗"
SPACES = ["\u00a0", "\u2000", "\u2003", "\u2009", "\u200a", "\u202f", "\u205f", "\u3000", "\u1680",
          "\t", "\n", "\r\n", "\r", "\u2028", "\u2029", "\u0085", "\u000b", "\u000c"]
ZERO_WIDTH = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u180e"]
CONTROLS = [chr(c) for c in list(range(0, 9)) + list(range(14, 32)) + [0x7F, 0x80, 0x9F]] + ["\ufffd", "\ue000", "\U000F0000"]
NUMBERS = ["1,234.56", "3.14159", "1e-9", "-42", "+7", "0x1F", "½", "¾", "²", "³", "¹", "１２３", "٣", "Ⅻ", "①",
           "$19.99", "€5,00", "10%", "2024-05-01", "12:30:59", "1st", "2nd", "3rd", "∞", "10⁶", "⅞"]
LIGATURES = ["ﬁ", "ﬂ", "ﬀ", "ﬃ", "Ǆ", "ǅ", "Ǳ", "ǲ", "ʼn", "ẞ", "ﬅ", "Ⅸ", "㎏", "㈱", "Ⓐ", "ⓩ"]


def word(r):
    return r.choice(WORDS)


def sentence(r, n=None):
    n = n or r.randint(1, 14)
    s = " ".join(word(r) for _ in range(n))
    if r.random() < 0.5:
        s = s[0].upper() + s[1:]
    return s + r.choice([".", "!", "?", "", "...", ",", ";"])


def accented(r):
    out = []
    for _ in range(r.randint(1, 8)):
        w = "".join(r.choice(ACCENTED + "abcdefghij") for _ in range(r.randint(1, 10)))
        if r.random() < 0.4:
            w = "".join(c + (r.choice(COMBINING) if r.random() < 0.3 else "") for c in w)
        out.append(w)
    return " ".join(out)


def script(r):
    pools = [GREEK, CYRILLIC, ARABIC, HEBREW, DEVANAGARI, THAI, KANA, HANGUL]
    return " ".join(r.choice(r.choice(pools)) for _ in range(r.randint(1, 8)))


def cjk(r):
    s = "".join(r.choice(CJK_BMP) if r.random() < 0.8 else r.choice(CJK_OTHER) for _ in range(r.randint(1, 30)))
    if r.random() < 0.5:
        s = s[:len(s) // 2] + r.choice(["，", "。", " ", "abc", "123", "ＡＢＣ"]) + s[len(s) // 2:]
    return s


def emoji(r):
    return "".join(r.choice(EMOJI) + (" " if r.random() < 0.5 else "") + (word(r) if r.random() < 0.3 else "")
                   for _ in range(r.randint(1, 8)))


def punct(r):
    pool = ASCII_PUNCT + UNI_PUNCT + SYMBOLS
    s = "".join(r.choice(pool) for _ in range(r.randint(1, 20)))
    if r.random() < 0.5:
        s = word(r) + s + word(r)
    return s


def spaces(r):
    parts = []
    for _ in range(r.randint(1, 8)):
        parts.append(word(r))
        parts.append("".join(r.choice(SPACES + ZERO_WIDTH + [" "]) for _ in range(r.randint(1, 4))))
    if r.random() < 0.5:
        parts.insert(0, " " * r.randint(1, 3))
    return "".join(parts)


def controls(r):
    return "".join(r.choice(CONTROLS) + word(r) if r.random() < 0.5 else r.choice(CONTROLS) for _ in range(r.randint(1, 8)))


def numbers(r):
    return " ".join(r.choice(NUMBERS) if r.random() < 0.7 else word(r) for _ in range(r.randint(1, 10)))


def soup(r):
    fams = [sentence, accented, script, cjk, emoji, punct, spaces, numbers, lambda r: "".join(r.sample(LIGATURES, 3))]
    return "".join(r.choice(fams)(r) + r.choice(["", " "]) for _ in range(r.randint(2, 6)))


def longword(r):
    base = r.choice(["a", "ab", "xyz", "é", "ünïcödé", "lorem", "Ωμέγα", "🤖"])
    return (base * (200 // len(base) + 1))[: r.randint(95, 140)] + r.choice(["", " end", "!"])


def run(r):
    c = r.choice(["a", " ", ".", "!", "é", "\u0301", "中", "😀", "\u200b", "-", "#", "\n", "9", "##"])
    return r.choice(["", "x"]) + c * r.randint(50, 3000)


def specials(r):
    marks = ["[CLS]", "[SEP]", "[MASK]", "[UNK]", "[PAD]", "<s>", "</s>", "<unk>", "<pad>", "<mask>", "<|endoftext|>"]
    return "".join(r.choice(marks) + r.choice(["", " ", "  "]) + (word(r) if r.random() < 0.6 else "")
                   for _ in range(r.randint(1, 5)))


def huge(r):
    fams = [sentence, accented, script, cjk, emoji, punct, spaces, numbers, soup]
    parts, n = [], 0
    while n < 10000:
        p = r.choice(fams)(r)
        parts.append(p)
        n += len(p) + 1
    return " ".join(parts)[:10000]


FAMILIES = [(sentence, 14), (accented, 10), (script, 10), (cjk, 8), (emoji, 8), (punct, 8), (spaces, 8),
            (controls, 5), (numbers, 6), (soup, 14), (longword, 3), (run, 3), (specials, 3)]


def generate(seed, n):
    r = random.Random(seed)
    fams = [f for f, w in FAMILIES for _ in range(w)]
    out = ["", " ", "hello", "Hello, World!", "ΟΔΟΣ", "İstanbul", "ﬁne", "x" * 101,
           "[CLS] a [MASK] b [SEP]", "x[UNK]y  [PAD]", "<s>hi</s> <unk> <pad>", "<|endoftext|>a<|endoftext|>",
           "[mask] [MASK][MASK]", "a <mask> b", "DON'T WE'LL THEY'RE I'M YOU'VE HE'D IT'S o'CLOCK",
           "'\u017f '\u015a x'Re 'LL'", "a\r\n\r\n  \n\t b  \r c \n", "12345678 1,234,567 \u0661\u0662\u0663\u0664",
           "<|begin_of_text|>hi<|eot_id|> <|endoftext|>"]
    for _ in range(4):
        out.append(huge(r))
    while len(out) < n:
        out.append(r.choice(fams)(r))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--n", type=int, default=1200)
    ap.add_argument("out")
    a = ap.parse_args()
    with open(a.out, "w") as f:
        for s in generate(a.seed, a.n):
            f.write(json.dumps(s) + "\n")


if __name__ == "__main__":
    main()
