#!/usr/bin/python3
"""Synthetic lip-sync avatar assets for mtserve's compositing, and a small client that
writes composited frames to disk.

usage:
  avatar.py assets OUTDIR [--frames 100] [--width 1280] [--height 720] [--crop 288] [--force]
      Writes OUTDIR/frames/000000.png ... (numbered RGB PNG frames with a visible, moving
      pattern: colour gradient, a scrolling checker band, a head-like ellipse, a frame counter
      bar) and OUTDIR/crop_rects.json (a list of {"x1","y1","x2","y2"} per frame: a mouth
      rectangle that drifts on a small ellipse and breathes in size). Skipped when
      OUTDIR/stamp.json matches the arguments. Needs numpy only (PNG written with zlib).
  avatar.py composite --url http://127.0.0.1:8000 --model lipsync_unet_w8 --frames 25
                      [--start 0] [--format jpeg|png|rgb] [--quality 85] --out DIR
      Sends random inputs in batches of 8 to POST /api/v1/lipsync/{model}/composite and writes the
      frames to DIR/frame_<index>.<ext> (rgb frames are written as binary PPM).

Library use (tests): write_png(path, rgb), read_png(data) -> HxWx3 uint8 (8-bit RGB/RGBA,
non-interlaced: enough for the frames mtserve writes), make_assets(outdir, ...),
parse_composite_response(body, header_len) -> (header dict, [frame bytes]).
"""
import argparse
import json
import os
import struct
import sys
import time
import urllib.request
import zlib

import numpy as np


def _chunk(tag, data):
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def png_bytes(rgb, level=6):
    h, w, c = rgb.shape
    assert c == 3 and rgb.dtype == np.uint8
    raw = np.zeros((h, w * 3 + 1), np.uint8)
    raw[:, 1:] = rgb.reshape(h, w * 3)
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(raw.tobytes(), level))
            + _chunk(b"IEND", b""))


def write_png(path, rgb, level=6):
    with open(path, "wb") as f:
        f.write(png_bytes(rgb, level))


def read_png(data):
    """Decodes an 8-bit, non-interlaced RGB or RGBA PNG (all five filter types) to HxWx3."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, w = 8, b"", None
    while pos < len(data):
        n, = struct.unpack(">I", data[pos:pos + 4])
        tag, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if tag == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and ctype in (2, 6) and interlace == 0, "unsupported PNG layout"
            bpp = 3 if ctype == 2 else 4
        elif tag == b"IDAT":
            idat += body
        pos += 12 + n
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, w * bpp + 1)
    out = np.zeros((h, w * bpp), np.int32)
    prev = np.zeros(w * bpp, np.int32)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        if f == 0:
            cur = line
        elif f == 2:
            cur = (line + prev) & 255
        else:
            cur = np.zeros_like(line)
            for x in range(w * bpp):
                a = cur[x - bpp] if x >= bpp else 0
                b = prev[x]
                c = prev[x - bpp] if x >= bpp else 0
                if f == 1:
                    p = a
                elif f == 3:
                    p = (a + b) // 2
                else:
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    p = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                cur[x] = (line[x] + p) & 255
        out[y] = cur
        prev = cur
    return out.reshape(h, w, bpp)[:, :, :3].astype(np.uint8)


def frame_image(i, n, width, height):
    """Frame i of n: a visible pattern that changes from frame to frame."""
    y, x = np.mgrid[0:height, 0:width]
    r = (x * 255 // max(width - 1, 1)).astype(np.uint8)
    g = (y * 255 // max(height - 1, 1)).astype(np.uint8)
    b = np.full((height, width), (i * 255 // max(n - 1, 1)), np.uint8)
    img = np.stack([r, g, b], axis=-1)
    # scrolling checker band at the top
    band = (y < height // 8) & ((((x + 8 * i) // 40) + (y // 40)) % 2 == 0)
    img[band] = (240, 240, 240)
    # head: an ellipse in skin tone around the centre
    cx, cy = width / 2, height / 2
    head = ((x - cx) / (width * 0.18)) ** 2 + ((y - cy) / (height * 0.38)) ** 2 <= 1
    img[head] = (224, 172, 105)
    # frame counter: a bar whose length is the frame index
    bar = (y >= height - 24) & (y < height - 8) & (x >= 16) & (x < 16 + (width - 32) * (i + 1) // n)
    img[bar] = (20, 20, 160)
    return img


def crop_rect(i, n, width, height, size):
    t = 2 * np.pi * i / max(n, 1)
    s = int(round(size * (1 + 0.08 * np.sin(2 * t))))
    cx = width / 2 + width * 0.02 * np.cos(t)
    cy = height * 0.62 + height * 0.02 * np.sin(t)
    x1 = int(round(cx - s / 2))
    y1 = int(round(cy - s / 2))
    x1 = min(max(x1, 0), width - s)
    y1 = min(max(y1, 0), height - s)
    return {"x1": x1, "y1": y1, "x2": x1 + s, "y2": y1 + s}


def make_assets(outdir, frames=100, width=1280, height=720, crop=288, force=False, level=6):
    args = {"frames": frames, "width": width, "height": height, "crop": crop, "version": 1}
    stamp = os.path.join(outdir, "stamp.json")
    if not force and os.path.exists(stamp):
        try:
            with open(stamp) as f:
                if json.load(f) == args:
                    return False
        except ValueError:
            pass
    fdir = os.path.join(outdir, "frames")
    os.makedirs(fdir, exist_ok=True)
    for name in os.listdir(fdir):
        if name.endswith(".png"):
            os.remove(os.path.join(fdir, name))
    crop = min(crop, width, height)
    for i in range(frames):
        write_png(os.path.join(fdir, "%06d.png" % i), frame_image(i, frames, width, height), level)
    with open(os.path.join(outdir, "crop_rects.json"), "w") as f:
        json.dump([crop_rect(i, frames, width, height, crop) for i in range(frames)], f)
    with open(stamp, "w") as f:
        json.dump(args, f)
    return True


def parse_composite_response(body, header_len):
    head = json.loads(body[:header_len])
    data = body[header_len:]
    return head, [data[fr["offset"]:fr["offset"] + fr["size"]] for fr in head["frames"]]


def composite(url, model, frames, start, fmt, quality, out, seed=0, batch=8):
    """Sends the frames in requests of at most `batch` frames (25 frames of inputs are 62 MB, above
    the server's default 50 MB message limit) and writes every returned frame."""
    rng = np.random.default_rng(seed)
    os.makedirs(out, exist_ok=True)
    t0 = time.time()
    done, inf_ms, comp_ms, enc_ms = 0, 0.0, 0.0, 0.0
    head = None
    while done < frames:
        n = min(batch, frames - done)
        visual = rng.random((n, 6, 320, 320), np.float32)
        audio = rng.standard_normal((n, 32, 16, 16), np.float32)
        q = "batch_size=%d&start_frame_idx=%d&format=%s&quality=%d" % (n, start + done, fmt, quality)
        req = urllib.request.Request("%s/api/v1/lipsync/%s/composite?%s" % (url.rstrip("/"), model, q),
                                     data=visual.tobytes() + audio.tobytes(), method="POST",
                                     headers={"Content-Type": "application/octet-stream"})
        with urllib.request.urlopen(req, timeout=300) as r:
            body = r.read()
            head, blobs = parse_composite_response(body, int(r.headers["Inference-Header-Content-Length"]))
        ext = {"jpeg": "jpg", "png": "png", "rgb": "ppm"}[head["format"]]
        for fr, blob in zip(head["frames"], blobs):
            path = os.path.join(out, "frame_%06d.%s" % (fr["frame_idx"], ext))
            with open(path, "wb") as f:
                if ext == "ppm":
                    f.write(b"P6\n%d %d\n255\n" % (head["width"], head["height"]))
                f.write(blob)
        done += len(blobs)
        inf_ms += head["inference_time_ms"]
        comp_ms += head["composite_time_ms"]
        enc_ms += head["encode_time_ms"]
    print("%d frames (%s, %dx%d) in %.0f ms: inference %.1f ms, composite %.1f ms, encode %.1f ms -> %s" % (
        done, head["format"], head["width"], head["height"], (time.time() - t0) * 1e3, inf_ms, comp_ms, enc_ms,
        out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("assets")
    a.add_argument("outdir")
    a.add_argument("--frames", type=int, default=100)
    a.add_argument("--width", type=int, default=1280)
    a.add_argument("--height", type=int, default=720)
    a.add_argument("--crop", type=int, default=288)
    a.add_argument("--force", action="store_true")
    c = sub.add_parser("composite")
    c.add_argument("--url", default="http://127.0.0.1:8000")
    c.add_argument("--model", default="lipsync_unet_w8")
    c.add_argument("--frames", type=int, default=25)
    c.add_argument("--start", type=int, default=0)
    c.add_argument("--format", default="jpeg")
    c.add_argument("--quality", type=int, default=85)
    c.add_argument("--out", default="composited")
    args = ap.parse_args()
    if args.cmd == "assets":
        t0 = time.time()
        made = make_assets(args.outdir, args.frames, args.width, args.height, args.crop, args.force)
        print("avatar assets %s: %d frames %dx%d %s" % (args.outdir, args.frames, args.width, args.height,
              "written in %.1f s" % (time.time() - t0) if made else "up to date"))
    else:
        composite(args.url, args.model, args.frames, args.start, args.format, args.quality, args.out)


if __name__ == "__main__":
    sys.exit(main())
