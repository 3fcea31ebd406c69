#!/usr/bin/python3
"""Deterministic, realistic inputs for the real-model zoo (tests/zoo/zoo.json).

Each model input in the manifest names a generator and its parameters; every generator is seeded,
so the same manifest gives byte-identical .npy files on every machine:

  image       a natural-looking picture rendered with PIL: sky/ground gradients, a sun, buildings,
              trees and blobs, low-frequency texture and grain (content "scene"); the same with
              several faces (content "faces"); a page of printed text lines (content "document");
              one printed text line, cropped like an OCR recogniser's input (content "text_line").
              Then resized, normalised ((pixel * scale - mean) / std, per channel), optionally an
              alpha channel appended, laid out NCHW or NHWC.
  speech      16 kHz speech-like audio: voiced bursts (a glottal-pulse harmonic series with a
              wandering pitch, shaped by three formant resonators), noise-like fricatives, pauses
              and a low noise floor; a window of it is returned as [1, N].
  mel         log-mel features of that audio (25 ms Hann STFT, 10 ms hop, 32 mel bands, dB scaled, offset to
              the level of openWakeWord's front end and mapped as it does: dB / 10 + 2), framed to
              the requested shape.
  features    smooth (time-correlated) Gaussian feature vectors, [1, T, D], for classifiers that
              take another network's embeddings.
  zeros       all-zero tensor of a shape and dtype (recurrent state at the start of a stream).
  const       a constant (e.g. a sample rate), scalar or shaped.

usage: inputs.py MODEL_ID OUTDIR [--manifest zoo.json]   writes OUTDIR/<input>.npy, prints NAME=FILE
       inputs.py --all OUTDIR   every model's inputs into OUTDIR/<id>/ (models fetched first); prints
                                per model one tab-separated line: id, model file, the NAME=FILE.npy
                                list and the NAME=d0,d1,... shape list (space-separated)
"""
import argparse
import json
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
FONT_DIRS = ["/usr/share/fonts/truetype/dejavu", "/usr/share/fonts/dejavu"]
DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32,
          "uint8": np.uint8, "bool": np.bool_}

WORDS = ("the quick brown fox jumps over lazy dog invoice total amount date number street city "
         "order shipped paid 2024 model server latency batch tensor page receipt item price qty "
         "hello world open source inference engine tenant request 42.50 07/11 No. A-113").split()


# ---------------------------------------------------------------------------------------------
# images

def _font(size, bold=False):
    from PIL import ImageFont
    name = "DejaVuSans-Bold.ttf" if bold else "DejaVuSans.ttf"
    for d in FONT_DIRS:
        p = os.path.join(d, name)
        if os.path.exists(p):
            return ImageFont.truetype(p, size)
    raise RuntimeError("inputs: DejaVu fonts not found (Debian package fonts-dejavu-core)")


def _smooth_noise(rng, h, w, cells, amp):
    """Low-frequency noise: a coarse random grid upsampled bicubically."""
    from PIL import Image
    g = rng.standard_normal((cells, cells)).astype(np.float32)
    img = Image.fromarray(g, mode="F").resize((w, h), Image.BICUBIC)
    return np.asarray(img, dtype=np.float32) * amp


def _scene(rng, w, h, faces=False):
    from PIL import Image, ImageDraw, ImageFilter
    y = np.linspace(0.0, 1.0, h, dtype=np.float32)[:, None, None]
    sky_top = np.array([70, 120, 200], np.float32)
    sky_bot = np.array([190, 215, 240], np.float32)
    horizon = int(h * rng.uniform(0.45, 0.65))
    arr = sky_top + (sky_bot - sky_top) * y
    arr = np.broadcast_to(arr, (h, w, 3)).copy()
    ground = np.array([90, 120, 60], np.float32) + np.array([40, 20, 10], np.float32) * y
    arr[horizon:] = np.broadcast_to(ground, (h, w, 3))[horizon:]
    img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    d = ImageDraw.Draw(img)
    s = max(w, h) / 512.0
    r = 30 * s
    cx, cy = rng.uniform(0.1, 0.9) * w, rng.uniform(0.05, 0.3) * h
    d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=(250, 235, 170))
    for _ in range(rng.integers(3, 7)):  # buildings
        bw, bh = rng.uniform(0.06, 0.18) * w, rng.uniform(0.1, 0.35) * h
        x0 = rng.uniform(0, w - bw)
        col = tuple(int(c) for c in rng.integers(60, 200, 3))
        d.rectangle([x0, horizon - bh, x0 + bw, horizon + 5 * s], fill=col, outline=(40, 40, 40))
        for wy in np.arange(horizon - bh + 8 * s, horizon - 8 * s, 18 * s):  # windows
            for wx in np.arange(x0 + 6 * s, x0 + bw - 10 * s, 16 * s):
                d.rectangle([wx, wy, wx + 7 * s, wy + 9 * s], fill=(230, 220, 150) if rng.random() < 0.4 else (50, 60, 80))
    for _ in range(rng.integers(3, 8)):  # trees
        tx, ty = rng.uniform(0, w), horizon + rng.uniform(0, 0.3) * h
        tr = rng.uniform(12, 35) * s
        d.rectangle([tx - 3 * s, ty - tr * 0.3, tx + 3 * s, ty + tr], fill=(90, 60, 30))
        d.ellipse([tx - tr, ty - 2 * tr, tx + tr, ty], fill=(30, int(rng.integers(90, 150)), 40))
    for _ in range(rng.integers(4, 9)):  # blobs and polygons in the foreground
        px, py = rng.uniform(0, w), rng.uniform(horizon, h)
        pr = rng.uniform(10, 45) * s
        col = tuple(int(c) for c in rng.integers(20, 240, 3))
        if rng.random() < 0.5:
            d.ellipse([px - pr, py - pr * 0.7, px + pr, py + pr * 0.7], fill=col)
        else:
            pts = [(px + pr * math.cos(a), py + pr * math.sin(a)) for a in np.sort(rng.uniform(0, 2 * math.pi, 5))]
            d.polygon(pts, fill=col)
    if faces:
        for _ in range(rng.integers(1, 4)):
            fw = rng.uniform(0.12, 0.3) * min(w, h)
            fx, fy = rng.uniform(fw, w - fw), rng.uniform(fw * 1.2, h - fw * 1.2)
            skin = (int(rng.integers(150, 235)), int(rng.integers(110, 190)), int(rng.integers(90, 160)))
            d.ellipse([fx - fw * 0.55, fy - fw * 0.85, fx + fw * 0.55, fy - fw * 0.1], fill=(40, 30, 25))  # hair
            d.ellipse([fx - fw / 2, fy - fw * 0.7, fx + fw / 2, fy + fw * 0.7], fill=skin)
            for ex in (-0.2, 0.2):
                d.ellipse([fx + (ex - 0.08) * fw, fy - 0.2 * fw, fx + (ex + 0.08) * fw, fy - 0.1 * fw], fill=(255, 255, 255))
                d.ellipse([fx + (ex - 0.04) * fw, fy - 0.19 * fw, fx + (ex + 0.04) * fw, fy - 0.11 * fw], fill=(50, 35, 20))
            d.polygon([(fx, fy - 0.05 * fw), (fx - 0.06 * fw, fy + 0.15 * fw), (fx + 0.06 * fw, fy + 0.15 * fw)],
                      fill=tuple(max(0, c - 30) for c in skin))
            d.chord([fx - 0.2 * fw, fy + 0.2 * fw, fx + 0.2 * fw, fy + 0.45 * fw], 0, 180, fill=(150, 50, 50))
    img = img.filter(ImageFilter.GaussianBlur(radius=0.8 * s))
    a = np.asarray(img, dtype=np.float32)
    a = a + _smooth_noise(rng, h, w, 12, 10.0)[:, :, None] + rng.normal(0, 3.0, a.shape).astype(np.float32)
    return np.clip(a, 0, 255)


def _text_lines(rng, n):
    return [" ".join(rng.choice(WORDS, int(rng.integers(3, 7)))) for _ in range(n)]


def _document(rng, w, h):
    from PIL import Image, ImageDraw
    bg = tuple(int(c) for c in (rng.integers(235, 255), rng.integers(232, 252), rng.integers(220, 245)))
    img = Image.new("RGB", (w, h), bg)
    d = ImageDraw.Draw(img)
    yy = int(h * 0.05)
    while yy < h * 0.92:
        size = int(rng.integers(max(10, h // 40), max(12, h // 16)))
        font = _font(size, bold=rng.random() < 0.2)
        txt = _text_lines(rng, 1)[0]
        ink = tuple(int(c) for c in rng.integers(0, 70, 3))
        d.text((int(w * rng.uniform(0.03, 0.2)), yy), txt, font=font, fill=ink)
        yy += int(size * rng.uniform(1.4, 2.4))
    a = np.asarray(img, dtype=np.float32)
    a = a + _smooth_noise(rng, h, w, 8, 4.0)[:, :, None] + rng.normal(0, 2.0, a.shape).astype(np.float32)
    return np.clip(a, 0, 255)


def _text_line(rng, w, h):
    """One printed line, its height filling the crop like a text detector's box (OCR recogniser input)."""
    from PIL import Image, ImageDraw
    font = _font(int(h * 0.62))
    txt = _text_lines(rng, 1)[0]
    tw = int(font.getlength(txt)) + int(h * 0.4)
    bg = tuple(int(c) for c in rng.integers(200, 250, 3))
    img = Image.new("RGB", (tw, h), bg)
    ImageDraw.Draw(img).text((int(h * 0.2), int(h * 0.12)), txt, font=font, fill=tuple(int(c) for c in rng.integers(0, 60, 3)))
    # resize to height h keeping the aspect ratio, then pad right to width w (PaddleOCR's scheme)
    nw = min(w, tw)
    img = img.resize((nw, h), Image.BILINEAR)
    a = np.full((h, w, 3), 0.0, np.float32)
    a[:, :nw] = np.asarray(img, dtype=np.float32)
    a[:, :nw] += rng.normal(0, 2.0, (h, nw, 3)).astype(np.float32)
    if nw < w:
        a[:, nw:] = np.array(bg, np.float32)  # padded with the background colour
    return np.clip(a, 0, 255)


def gen_image(p, rng):
    h, w = p["height"], p["width"]
    content = p.get("content", "scene")
    if content in ("scene", "faces"):
        a = _scene(rng, w, h, faces=(content == "faces"))
    elif content == "document":
        a = _document(rng, w, h)
    elif content == "text_line":
        a = _text_line(rng, w, h)
    else:
        raise ValueError(f"unknown image content '{content}'")
    a = a * float(p.get("scale", 1.0 / 255.0))
    mean = np.array(p.get("mean", [0.0, 0.0, 0.0]), np.float32)
    std = np.array(p.get("std", [1.0, 1.0, 1.0]), np.float32)
    a = (a - mean) / std
    if p.get("alpha") is not None:
        a = np.concatenate([a, np.full((h, w, 1), float(p["alpha"]), np.float32)], axis=2)
    if p.get("layout", "NCHW") == "NCHW":
        a = a.transpose(2, 0, 1)
    return a[None].astype(np.float32)


# ---------------------------------------------------------------------------------------------
# audio

def _resonator(x, f, bw, sr):
    """Two-pole resonator (a formant) at f Hz with bandwidth bw Hz."""
    r = math.exp(-math.pi * bw / sr)
    a1, a2 = -2 * r * math.cos(2 * math.pi * f / sr), r * r
    y = np.zeros_like(x)
    y1 = y2 = 0.0
    g = 1 - r
    for i in range(len(x)):
        v = g * x[i] - a1 * y1 - a2 * y2
        y[i] = v
        y2, y1 = y1, v
    return y


def speech_audio(seed, seconds=2.0, sr=16000):
    rng = np.random.default_rng(seed)
    n = int(seconds * sr)
    out = rng.normal(0, 0.002, n)  # noise floor
    t = int(0.12 * sr)
    vowels = [(730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480), (570, 840, 2410)]
    while t < n - int(0.1 * sr):
        seg = int(rng.uniform(0.12, 0.35) * sr)
        seg = min(seg, n - t)
        if rng.random() < 0.8:  # voiced syllable
            f0 = rng.uniform(95, 210) * (1 + 0.08 * np.sin(np.linspace(0, rng.uniform(1, 4), seg)))
            phase = np.cumsum(2 * np.pi * f0 / sr)
            src = np.zeros(seg)
            for k in range(1, 30):  # harmonic series with a -12 dB/octave glottal tilt
                fk = f0 * k
                src += np.where(fk < sr / 2 - 200, np.sin(k * phase) / (k * k) ** 0.75, 0.0)
            f1, f2, f3 = vowels[int(rng.integers(len(vowels)))]
            v = _resonator(src, f1, 90, sr) + 0.6 * _resonator(src, f2, 110, sr) + 0.3 * _resonator(src, f3, 160, sr)
        else:  # fricative
            v = _resonator(rng.normal(0, 1, seg), rng.uniform(3500, 6000), 1500, sr) * 0.5
        env = np.sin(np.linspace(0, np.pi, seg)) ** 0.6
        v = v / (np.max(np.abs(v)) + 1e-9) * rng.uniform(0.2, 0.6) * env
        out[t:t + seg] += v
        t += seg + int(rng.uniform(0.02, 0.25) * sr)  # pause
    return out.astype(np.float32)


def gen_speech(p, rng_seed):
    sr = p.get("sample_rate", 16000)
    n = p["samples"]
    off = int(p.get("offset_s", 0.0) * sr)
    a = speech_audio(rng_seed, seconds=max(2.0, (off + n) / sr + 0.1), sr=sr)
    return a[None, off:off + n].astype(np.float32)


def _mel_filters(sr, nfft, nmels, fmin=60.0, fmax=3800.0):
    mel = lambda f: 2595 * np.log10(1 + f / 700.0)
    imel = lambda m: 700 * (10 ** (m / 2595.0) - 1)
    pts = imel(np.linspace(mel(fmin), mel(fmax), nmels + 2))
    bins = np.fft.rfftfreq(nfft, 1.0 / sr)
    fb = np.zeros((nmels, len(bins)))
    for i in range(nmels):
        lo, c, hi = pts[i], pts[i + 1], pts[i + 2]
        fb[i] = np.maximum(0, np.minimum((bins - lo) / (c - lo), (hi - bins) / (hi - c)))
    return fb


def gen_mel(p, seed):
    shape = p["shape"]  # [1, frames, bands, 1] (openWakeWord embedding input)
    frames, bands = shape[1], shape[2]
    sr, hop, win = 16000, 160, 400
    audio = speech_audio(seed, seconds=(frames + 3) * hop / sr + 0.2)
    fb = _mel_filters(sr, 512, bands)
    w = np.hanning(win)
    spec = []
    for f in range(frames):
        s = audio[f * hop + int(p.get("offset_s", 0.1) * sr):][:win]
        s = np.pad(s, (0, win - len(s)))
        pw = np.abs(np.fft.rfft(s * w, 512)) ** 2
        spec.append(10 * np.log10(np.maximum(fb @ pw, 1e-10)))
    # dB_offset aligns the level with openWakeWord's own front end (oww_melspectrogram's output)
    spec = (np.array(spec) + p.get("db_offset", -22.0)) / 10.0 + 2.0
    return spec.reshape(shape).astype(np.float32)


def gen_features(p, rng):
    shape = p["shape"]
    x = rng.standard_normal(shape).astype(np.float32)
    k = p.get("smooth", 4)
    if k > 1 and len(shape) >= 2:  # moving average along time (axis 1)
        c = np.cumsum(np.pad(x, [(0, 0), (k, 0)] + [(0, 0)] * (len(shape) - 2)), axis=1)
        x = (c[:, k:] - c[:, :-k]) / math.sqrt(k)
    return (x * p.get("scale", 1.0) + p.get("offset", 0.0)).astype(np.float32)


# ---------------------------------------------------------------------------------------------

def make_input(spec, seed):
    g = spec["gen"]
    rng = np.random.default_rng(seed)
    dtype = DTYPES[spec.get("dtype", "float32")]
    if g == "image":
        a = gen_image(spec, rng)
    elif g == "speech":
        a = gen_speech(spec, seed)
    elif g == "mel":
        a = gen_mel(spec, seed)
    elif g == "features":
        a = gen_features(spec, rng)
    elif g == "zeros":
        a = np.zeros(spec["shape"])
    elif g == "const":
        a = np.full(spec.get("shape", []), spec["value"])
    else:
        raise ValueError(f"unknown input generator '{g}'")
    return np.array(a, dtype=dtype, order="C")  # keeps rank 0 (ascontiguousarray would not)


def model_inputs(model):
    """{input name: ndarray} for a manifest model entry (seeds: model seed + input index)."""
    base = model.get("seed", 0)
    return {name: make_input(spec, base + i) for i, (name, spec) in enumerate(model["inputs"].items())}


def check_against_model(model_file, arrays):
    """Verifies the arrays against the model's declared inputs (names, element types, ranks, fixed
    dims); returns a list of problems."""
    import onnx
    from onnx import mapping
    m = onnx.load(model_file, load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    declared = {v.name: v for v in m.graph.input if v.name not in inits}
    probs = []
    for n in declared:
        if n not in arrays:
            probs.append(f"model input '{n}' has no generator")
    for n, a in arrays.items():
        if n not in declared:
            probs.append(f"'{n}' is not a model input (inputs: {', '.join(declared)})")
            continue
        tt = declared[n].type.tensor_type
        want = mapping.TENSOR_TYPE_TO_NP_TYPE.get(tt.elem_type)
        if want is not None and np.dtype(want) != a.dtype:
            probs.append(f"'{n}': generated {a.dtype}, model declares {np.dtype(want)}")
        if tt.HasField("shape"):
            dims = tt.shape.dim
            if len(dims) != a.ndim:
                probs.append(f"'{n}': generated rank {a.ndim}, model declares rank {len(dims)}")
            else:
                for i, d in enumerate(dims):
                    if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != a.shape[i]:
                        probs.append(f"'{n}': dim {i} is {a.shape[i]}, model declares {d.dim_value}")
    return probs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_id", nargs="?")
    ap.add_argument("outdir")
    ap.add_argument("--manifest", default=os.path.join(HERE, "zoo.json"))
    ap.add_argument("--all", action="store_true")
    a = ap.parse_args()
    with open(a.manifest) as f:
        man = json.load(f)
    if a.all:
        import fetch
        errors = fetch.fetch(man["models"])
        if errors:
            sys.exit("inputs: cannot fetch: " + "; ".join(errors))
        for m in man["models"]:
            d = os.path.join(a.outdir, m["id"])
            os.makedirs(d, exist_ok=True)
            files, shapes = [], []
            for name, arr in model_inputs(m).items():
                p = os.path.join(d, name.replace("/", "_").replace(":", "_") + ".npy")
                np.save(p, arr)
                files.append(f"{name}={p}")
                shapes.append(f"{name}=" + ",".join(str(x) for x in arr.shape))
            print("\t".join([m["id"], fetch.model_path(m), " ".join(files), " ".join(shapes)]))
        return
    if not a.model_id:
        sys.exit("inputs: MODEL_ID OUTDIR, or --all OUTDIR")
    ms = [m for m in man["models"] if m["id"] == a.model_id]
    if not ms:
        sys.exit(f"inputs: no model '{a.model_id}' in {a.manifest}")
    os.makedirs(a.outdir, exist_ok=True)
    for name, arr in model_inputs(ms[0]).items():
        p = os.path.join(a.outdir, name.replace("/", "_").replace(":", "_") + ".npy")
        np.save(p, arr)
        print(f"{name}={p}")


if __name__ == "__main__":
    main()
