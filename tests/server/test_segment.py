"""Black-box tests of the REST segmentation endpoints (/api/v1/segment and
/api/v1/batch-segment, multipart/form-data uploads with model and threshold fields) against a
real `mtserve serve`, with Python requests building the forms.

The mask is checked against a reference computed here: the image is resized to the model input
in numpy (bilinear, pixel centres aligned, /255), the same server runs the model through the
KServe v2 binary infer route, and the probability map is resized back and thresholded in numpy.
Pixels whose probability lies within 1e-4 of the threshold may differ (float rounding); nothing
else may. Also: JPEG uploads, batches of mixed sizes, the PNG response, multi-image limits, and
one request per class of bad input (the server keeps serving after each).
"""
import base64
import io
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import requests
from PIL import Image

from conftest import SEG, binary_body, parse_response

CBAM = SEG.parent / "cbam_resunet.onnx"


def png_bytes(a):
    b = io.BytesIO()
    Image.fromarray(a).save(b, format="PNG")
    return b.getvalue()


def jpeg_bytes(a, q=90):
    b = io.BytesIO()
    Image.fromarray(a).save(b, format="JPEG", quality=q)
    return b.getvalue()


def test_image(h, w, seed):
    """A photo-like image: smooth blobs plus noise (so the model output is not trivial)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    a = np.zeros((h, w, 3), np.float32)
    for _ in range(4):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(10, max(h, w) / 3)
        a += rng.uniform(60, 200, 3) * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r * r))[..., None]
    a += rng.normal(0, 12, a.shape)
    return np.clip(a, 0, 255).astype(np.uint8)


test_image.__test__ = False  # a helper, not a test


def axis(src, dst):
    s = np.clip((np.arange(dst) + 0.5) * src / dst - 0.5, 0, src - 1)
    i0 = np.floor(s).astype(int)
    return i0, np.minimum(i0 + 1, src - 1), (s - i0).astype(np.float32)


def bilinear(a, oh, ow):
    """a: H x W x C float -> oh x ow x C (the server's convention; rows first, then columns)."""
    y0, y1, wy = axis(a.shape[0], oh)
    x0, x1, wx = axis(a.shape[1], ow)
    rows = a[y0] + wy[:, None, None] * (a[y1] - a[y0])
    return rows[:, x0] + wx[None, :, None] * (rows[:, x1] - rows[:, x0])


def reference_probs(srv, model, img, side=256):
    x = bilinear(img.astype(np.float32), side, side) / 255.0
    x = np.ascontiguousarray(x.transpose(2, 0, 1)[None]).astype(np.float32)
    body, headers = binary_body([("image", x)], parameters={"binary_data_output": True})
    r = srv.infer(model, body, headers=headers)
    assert r.status_code == 200, r.text
    outs, _ = parse_response(r)
    return outs["mask"][0, 0]  # 256 x 256


def decode_mask(b64):
    m = Image.open(io.BytesIO(base64.b64decode(b64)))
    assert m.mode == "L"
    return np.asarray(m)


def check_mask(got, probs, img_shape, threshold):
    p = bilinear(probs[..., None].astype(np.float32), img_shape[0], img_shape[1])[..., 0]
    want = np.where(p > threshold, 255, 0)
    assert got.shape == want.shape
    differ = got != want
    near = np.abs(p - threshold) < 1e-4
    assert not (differ & ~near).any(), f"{int((differ & ~near).sum())} mask pixels differ away from the threshold"
    return want


def post(srv, route, files, data=None, params=None):
    return requests.post(f"{srv.url}/api/v1/{route}", files=files, data=data or {}, params=params or {}, timeout=120)


def test_segment_mask_matches_reference(start_server):
    srv = start_server({"seg_unet": SEG})
    img = test_image(300, 410, 1)
    probs = reference_probs(srv, "seg_unet", img)
    thr = float(np.quantile(probs, 0.6))  # a threshold that gives both classes
    r = post(srv, "segment", {"file": ("cells.png", png_bytes(img), "image/png")},
             {"model": "seg_unet", "threshold": str(thr)})
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["model_name"] == "seg_unet" and j["filename"] == "cells.png"
    assert (j["width"], j["height"], j["classes"]) == (410, 300, 1)
    assert abs(j["threshold"] - thr) < 1e-6
    got = decode_mask(j["mask_png_base64"])
    want = check_mask(got, probs, img.shape, thr)
    fg = int((got == 255).sum())
    assert 0 < fg < got.size and j["foreground_pixels"] == fg
    assert abs(j["foreground_fraction"] - fg / got.size) < 1e-9
    ys, xs = np.nonzero(got)
    assert j["bbox"] == [int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1]
    assert set(j["timings_ms"]) == {"decode_resize", "queue", "inference", "mask_encode"}
    assert j["timings_ms"]["inference"] > 0
    assert (want == got).mean() > 0.999

    # the same with model and threshold in the query string, answered as the PNG itself
    r = post(srv, "segment", {"image": ("x", png_bytes(img))}, params={"model": "seg_unet", "threshold": thr,
                                                                         "response": "png"})
    assert r.status_code == 200 and r.headers["Content-Type"] == "image/png"
    assert int(r.headers["X-Foreground-Pixels"]) == fg and r.headers["X-Mask-Size"] == "410x300"
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(r.content))), got)

    # threshold 1 leaves nothing; default threshold 0.5 is used when the field is absent
    r = post(srv, "segment", {"file": ("a.png", png_bytes(img))}, {"model": "seg_unet", "threshold": "1"})
    assert r.json()["foreground_pixels"] == 0 and r.json()["bbox"] is None
    r = post(srv, "segment", {"file": ("a.png", png_bytes(img))}, {"model": "seg_unet"})
    assert r.json()["threshold"] == 0.5
    check_mask(decode_mask(r.json()["mask_png_base64"]), probs, img.shape, 0.5)


def test_jpeg_and_batch(start_server):
    srv = start_server({"seg_unet": SEG, "cbam": CBAM})
    imgs = [test_image(200, 260, 2), test_image(97, 333, 3), test_image(256, 256, 4)]
    # JPEG upload: the server decodes what PIL decodes (libjpeg-turbo both), so the reference uses
    # PIL's decoding of the same bytes
    jb = jpeg_bytes(imgs[0])
    dec = np.asarray(Image.open(io.BytesIO(jb)).convert("RGB"))
    probs = reference_probs(srv, "seg_unet", dec)
    r = post(srv, "segment", {"file": ("p.jpg", jb, "image/jpeg")}, {"model": "seg_unet", "threshold": "0.5"})
    assert r.status_code == 200, r.text
    check_mask(decode_mask(r.json()["mask_png_base64"]), probs, dec.shape, 0.5)

    # a batch of three sizes, PNG and JPEG mixed, on the CBAM model: each result as if alone
    files = [("files", ("a.png", png_bytes(imgs[0]))), ("files", ("b.jpg", jpeg_bytes(imgs[1]))),
             ("files", ("c.png", png_bytes(imgs[2])))]
    r = post(srv, "batch-segment", files, {"model": "cbam", "threshold": "0.5"})
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["batch_size"] == 3 and [x["filename"] for x in j["results"]] == ["a.png", "b.jpg", "c.png"]
    for res, (name, data) in zip(j["results"], [f[1] for f in files]):
        img = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        assert (res["width"], res["height"]) == (img.shape[1], img.shape[0])
        check_mask(decode_mask(res["mask_png_base64"]), reference_probs(srv, "cbam", img), img.shape, 0.5)

    # concurrent uploads from 8 clients all succeed
    def one(i):
        return post(srv, "segment", {"file": ("a.png", png_bytes(imgs[i % 3]))}, {"model": "seg_unet"}).status_code

    with ThreadPoolExecutor(8) as ex:
        assert list(ex.map(one, range(8))) == [200] * 8


def test_bad_uploads_get_clear_errors(start_server):
    srv = start_server({"seg_unet": SEG, "tiny": SEG.parent / "tiny.onnx"})
    good = png_bytes(test_image(64, 80, 5))
    url = f"{srv.url}/api/v1/segment"

    def expect(status, words, **kw):
        r = requests.post(url, timeout=60, **kw)
        assert r.status_code == status, (r.status_code, r.text)
        for w in words:
            assert w in r.json()["error"], r.text

    expect(400, ["expected multipart/form-data"], json={"model": "seg_unet"})
    expect(400, ["no boundary"], data=b"x", headers={"Content-Type": "multipart/form-data"})
    expect(400, ["not terminated"], data=b"--b\r\nContent-Disposition: form-data; name=model\r\n\r\nseg",
           headers={"Content-Type": "multipart/form-data; boundary=b"})
    expect(400, ["no 'model' field"], files={"file": ("a.png", good)})
    expect(400, ["no image"], data={"model": "seg_unet"}, files={"other": (None, "x")})
    expect(404, ["unknown model 'nope'"], files={"file": ("a.png", good)}, data={"model": "nope"})
    expect(412, ["not an image segmentation model"], files={"file": ("a.png", good)}, data={"model": "tiny"})
    expect(400, ["threshold must be a number in 0..1"], files={"file": ("a.png", good)},
           data={"model": "seg_unet", "threshold": "1.5"})
    expect(400, ["threshold"], files={"file": ("a.png", good)}, data={"model": "seg_unet", "threshold": "half"})
    expect(400, ["response must be json or png"], files={"file": ("a.png", good)},
           data={"model": "seg_unet", "response": "gif"})
    expect(400, ["several images", "batch-segment"], files=[("file", ("a.png", good)), ("file", ("b.png", good))],
           data={"model": "seg_unet"})
    expect(400, ["image 0 ('a.gif')", "not a PNG or JPEG"], files={"file": ("a.gif", b"GIF89a....")},
           data={"model": "seg_unet"})
    expect(400, ["image 0", "corrupt PNG"], files={"file": ("t.png", good[: len(good) // 2])},
           data={"model": "seg_unet"})
    jb = jpeg_bytes(test_image(64, 80, 6))
    expect(400, ["image 0", "corrupt JPEG"], files={"file": ("t.jpg", jb[: len(jb) // 2])},
           data={"model": "seg_unet"})
    # PNG headers claiming 30000 x 30000 (a side over 16384) and 10000 x 10000 pixels (over 40 M):
    # refused from the header, nothing allocated
    for side in (30000, 10000):
        big = bytearray(png_bytes(np.zeros((1, 1, 3), np.uint8)))
        big[16:24] = side.to_bytes(4, "big") * 2
        big[29:33] = zlib.crc32(bytes(big[12:29])).to_bytes(4, "big")
        expect(413, ["image 0", f"a {side}x{side} PNG is over the limits"], files={"file": ("big.png", bytes(big))},
               data={"model": "seg_unet"})
    many = [("files", (f"{i}.png", good)) for i in range(65)]
    r = requests.post(f"{srv.url}/api/v1/batch-segment", files=many, data={"model": "seg_unet"}, timeout=60)
    assert r.status_code == 400 and "at most 64" in r.json()["error"]
    r = requests.get(url, timeout=30)
    assert r.status_code == 405
    # still serving
    r = requests.post(url, files={"file": ("a.png", good)}, data={"model": "seg_unet"}, timeout=60)
    assert r.status_code == 200 and r.json()["width"] == 80
