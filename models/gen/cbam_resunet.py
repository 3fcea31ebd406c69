"""Residual U-Net with CBAM attention generator (cbam_resunet.onnx).

Input `image` N x 3 x 256 x 256, output `mask` N x 1 x 256 x 256 (Sigmoid).
Residual blocks (3x3 Conv-BN-Relu, 3x3 Conv-BN, CBAM, Add shortcut (1x1 conv +
BN when the shape changes), Relu); stride-2 downsampling 256->128->64->32,
nearest Resize x2 + skip Concat upsampling. CBAM = channel attention
(ReduceMean and ReduceMax over H,W with axes attribute and keepdims=1 -> shared
two-layer 1x1-conv MLP -> Add -> Sigmoid -> Mul) followed by spatial attention
(ReduceMean and ReduceMax over the channel axis -> Concat -> 7x7 conv ->
Sigmoid -> Mul).
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import FLOAT, GraphBuilder  # noqa: E402

CHANS = [16, 32, 64, 128]


def cbam(g, x, c, name, ratio=8):
    h = max(c // ratio, 4)
    # channel attention: shared MLP weights used by both pooled branches
    w1 = g.init(name + ".ca.fc1.weight", g.randn((h, c, 1, 1), math.sqrt(2.0 / c)))
    b1 = g.init(name + ".ca.fc1.bias", g.randn((h,), 0.05))
    w2 = g.init(name + ".ca.fc2.weight", g.randn((c, h, 1, 1), 1.0 / math.sqrt(h)))
    b2 = g.init(name + ".ca.fc2.bias", g.randn((c,), 0.05))
    pooled = [
        g.node("ReduceMean", [x], name=name + ".ca.avg", axes=[2, 3], keepdims=1),
        g.node("ReduceMax", [x], name=name + ".ca.max", axes=[2, 3], keepdims=1),
    ]
    branches = []
    for i, p in enumerate(pooled):
        t = g.node("Conv", [p, w1, b1], name="%s.ca.fc1_%d" % (name, i), kernel_shape=[1, 1])
        t = g.act(t, "relu", "%s.ca.relu_%d" % (name, i))
        t = g.node("Conv", [t, w2, b2], name="%s.ca.fc2_%d" % (name, i), kernel_shape=[1, 1])
        branches.append(t)
    ca = g.node("Add", branches, name=name + ".ca.add")
    ca = g.act(ca, "sigmoid", name + ".ca.sigmoid")
    x = g.node("Mul", [x, ca], name=name + ".ca.mul")
    # spatial attention
    sm = g.node("ReduceMean", [x], name=name + ".sa.avg", axes=[1], keepdims=1)
    sx = g.node("ReduceMax", [x], name=name + ".sa.max", axes=[1], keepdims=1)
    s = g.node("Concat", [sm, sx], name=name + ".sa.concat", axis=1)
    s = g.conv(s, 2, 1, 7, name + ".sa.conv", gain=1.0)
    s = g.act(s, "sigmoid", name + ".sa.sigmoid")
    return g.node("Mul", [x, s], name=name + ".sa.mul")


def res_block(g, x, cin, cout, name, stride=1):
    y = g.conv(x, cin, cout, 3, name + ".conv1", stride=stride, bias=False)
    y = g.bn(y, cout, name + ".bn1")
    y = g.act(y, "relu", name + ".relu1")
    y = g.conv(y, cout, cout, 3, name + ".conv2", bias=False, gain=1.0)
    y = g.bn(y, cout, name + ".bn2")
    y = cbam(g, y, cout, name + ".cbam")
    if cin != cout or stride != 1:
        sc = g.conv(x, cin, cout, 1, name + ".short.conv", stride=stride, bias=False, gain=1.0)
        sc = g.bn(sc, cout, name + ".short.bn")
    else:
        sc = x
    y = g.node("Add", [y, sc], name=name + ".add")
    return g.act(y, "relu", name + ".relu2")


def build():
    g = GraphBuilder("cbam_resunet", seed=3001)
    x = g.input("image", FLOAT, ["N", 3, 256, 256])
    x = g.conv(x, 3, CHANS[0], 3, "stem.conv", bias=False)
    x = g.bn(x, CHANS[0], "stem.bn")
    x = g.act(x, "relu", "stem.relu")
    skips = []
    cin = CHANS[0]
    for lvl, c in enumerate(CHANS):
        x = res_block(g, x, cin, c, "enc%d" % lvl, stride=1 if lvl == 0 else 2)
        skips.append(x)
        cin = c
    x = skips.pop()  # 128 x 32 x 32
    for lvl in range(len(CHANS) - 2, -1, -1):
        u = g.resize(x, 2.0, "nearest", "dec%d.up" % lvl)
        u = g.node("Concat", [u, skips[lvl]], name="dec%d.concat" % lvl, axis=1)
        x = res_block(g, u, CHANS[lvl + 1] + CHANS[lvl], CHANS[lvl], "dec%d" % lvl)
    # CBAM gating shrinks activations (~0.2 rms here); scale the head so the
    # Sigmoid input spans a useful range instead of sitting at 0.
    y = g.conv(x, CHANS[0], 1, 1, "head.conv", gain=12.0)
    g.node("Sigmoid", [y], name="head.sigmoid", outputs=["mask"])
    g.output("mask", FLOAT, ["N", 1, 256, 256])
    return g.model("residual U-Net with CBAM channel + spatial attention")


def models():
    return {"cbam_resunet.onnx": build}


if __name__ == "__main__":
    import onnx
    onnx.save(build(), os.path.join(sys.argv[1] if len(sys.argv) > 1 else ".", "cbam_resunet.onnx"))
