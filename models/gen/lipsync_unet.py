"""Lipsync U-Net family generator (lipsync_unet_w{4,8,16,32}.onnx).

Inputs `visual` N x 6 x 320 x 320 and `audio` N x 32 x 16 x 16, output `output`
N x 3 x 320 x 320 (Sigmoid). Visual encoder: 3x3 stem then stride-2 3x3 convs
320->160->80->40->20 with channels w, 2w, 4w, 8w, 16w, every stage followed by a
depthwise-separable residual block (depthwise 3x3 group=C, Relu, pointwise 1x1,
Add). Audio branch: two 3x3 convs on 16x16, linear Resize (scales 1.25) to the
20x20 bottleneck, Concat with the visual bottleneck, 3x3 fuse convs. Decoder per
level: nearest Resize x2 (scales initializer), 3x3 conv + Relu, Concat with the
encoder skip, 3x3 conv + Relu. Head: 3x3 conv to 3 channels + Sigmoid.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import FLOAT, GraphBuilder  # noqa: E402

WIDTHS = (4, 8, 16, 32)


def ds_block(g, x, c, name):
    """Depthwise-separable residual block: x + pw1x1(relu(dw3x3(x)))."""
    d = g.conv(x, c, c, 3, name + ".dw", group=c, gain=1.0)
    d = g.act(d, "relu", name=name + ".relu")
    p = g.conv(d, c, c, 1, name + ".pw", gain=0.5)
    return g.node("Add", [x, p], name=name + ".add")


def build(width):
    w = width
    g = GraphBuilder("lipsync_unet_w%d" % w, seed=1000 + w)
    vis = g.input("visual", FLOAT, ["N", 6, 320, 320])
    aud = g.input("audio", FLOAT, ["N", 32, 16, 16])

    chans = [w, 2 * w, 4 * w, 8 * w, 16 * w]
    # ---- visual encoder -------------------------------------------------------
    skips = []
    x = g.conv(vis, 6, chans[0], 3, "enc0.conv")
    x = g.act(x, "lrelu", "enc0.act")
    x = ds_block(g, x, chans[0], "enc0.ds")
    skips.append(x)
    for lvl in range(1, 5):
        x = g.conv(x, chans[lvl - 1], chans[lvl], 3, "enc%d.down" % lvl, stride=2)
        x = g.act(x, "lrelu", "enc%d.act" % lvl)
        x = ds_block(g, x, chans[lvl], "enc%d.ds" % lvl)
        skips.append(x)
    v = skips.pop()  # 16w x 20 x 20 bottleneck (audio adds 4w)

    # ---- audio branch ---------------------------------------------------------
    a = g.conv(aud, 32, 4 * w, 3, "audio.conv1")
    a = g.act(a, "lrelu", "audio.act1")
    a = g.conv(a, 4 * w, 4 * w, 3, "audio.conv2")
    a = g.act(a, "lrelu", "audio.act2")
    a = g.resize(a, 1.25, "linear", "audio.resize")  # 16x16 -> 20x20, half_pixel

    # ---- bottleneck fuse ------------------------------------------------------
    x = g.node("Concat", [v, a], name="bottleneck.concat", axis=1)
    x = g.conv(x, 20 * w, 16 * w, 3, "bottleneck.fuse")
    x = g.act(x, "lrelu", "bottleneck.act")
    x = ds_block(g, x, 16 * w, "bottleneck.ds")
    x = g.conv(x, 16 * w, 16 * w, 3, "bottleneck.conv2")
    x = g.act(x, "lrelu", "bottleneck.act2")

    # ---- decoder --------------------------------------------------------------
    for lvl in range(3, -1, -1):
        c = chans[lvl]
        u = g.resize(x, 2.0, "nearest", "dec%d.up" % lvl,
                     coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        u = g.conv(u, chans[lvl + 1], c, 3, "dec%d.conv1" % lvl)
        u = g.act(u, "relu", "dec%d.relu1" % lvl)
        u = g.node("Concat", [u, skips[lvl]], name="dec%d.concat" % lvl, axis=1)
        u = g.conv(u, 2 * c, c, 3, "dec%d.conv2" % lvl)
        x = g.act(u, "relu", "dec%d.relu2" % lvl)

    y = g.conv(x, w, 3, 3, "head.conv", gain=1.0)
    g.node("Sigmoid", [y], name="head.sigmoid", outputs=["output"])
    g.output("output", FLOAT, ["N", 3, 320, 320])
    return g.model("lipsync U-Net, width %d" % w)


def models():
    """filename -> zero-argument builder, for generate_all.py."""
    return {"lipsync_unet_w%d.onnx" % w: (lambda w=w: build(w)) for w in WIDTHS}


if __name__ == "__main__":
    import onnx
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    for fname, fn in models().items():
        onnx.save(fn(), os.path.join(out, fname))
        print(fname)
