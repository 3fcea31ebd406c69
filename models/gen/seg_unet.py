"""Segmentation U-Net generator (seg_unet.onnx).

Input `image` N x 3 x 256 x 256, output `mask` N x 1 x 256 x 256 (Sigmoid).
Classic U-Net with base width 16: each level is two (3x3 Conv -> BatchNormalization
-> Relu) units, MaxPool 2x2 downsampling (256->128->64->32->16), ConvTranspose
2x2 stride 2 upsampling with skip Concats, and a 1x1 conv head.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import FLOAT, GraphBuilder  # noqa: E402

BASE = 16
LEVELS = 4


def double_conv(g, x, cin, cout, name):
    for i in (1, 2):
        x = g.conv(x, cin if i == 1 else cout, cout, 3, "%s.conv%d" % (name, i), bias=False)
        x = g.bn(x, cout, "%s.bn%d" % (name, i))
        x = g.act(x, "relu", "%s.relu%d" % (name, i))
    return x


def build():
    g = GraphBuilder("seg_unet", seed=2001)
    x = g.input("image", FLOAT, ["N", 3, 256, 256])
    chans = [BASE * (2 ** i) for i in range(LEVELS + 1)]  # 16 32 64 128 256
    skips = []
    cin = 3
    for lvl in range(LEVELS):
        x = double_conv(g, x, cin, chans[lvl], "down%d" % lvl)
        skips.append(x)
        x = g.node("MaxPool", [x], name="pool%d" % lvl, kernel_shape=[2, 2], strides=[2, 2])
        cin = chans[lvl]
    x = double_conv(g, x, cin, chans[LEVELS], "bottleneck")
    for lvl in range(LEVELS - 1, -1, -1):
        x = g.conv_t(x, chans[lvl + 1], chans[lvl], 2, 2, "up%d.tconv" % lvl)
        x = g.node("Concat", [skips[lvl], x], name="up%d.concat" % lvl, axis=1)
        x = double_conv(g, x, 2 * chans[lvl], chans[lvl], "up%d" % lvl)
    y = g.conv(x, chans[0], 1, 1, "head.conv", gain=1.0)
    g.node("Sigmoid", [y], name="head.sigmoid", outputs=["mask"])
    g.output("mask", FLOAT, ["N", 1, 256, 256])
    return g.model("segmentation U-Net (BatchNorm, MaxPool, ConvTranspose)")


def models():
    return {"seg_unet.onnx": build}


if __name__ == "__main__":
    import onnx
    onnx.save(build(), os.path.join(sys.argv[1] if len(sys.argv) > 1 else ".", "seg_unet.onnx"))
