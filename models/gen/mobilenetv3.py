"""MobileNetV3-Small style classifier generator (mobilenetv3.onnx).

Input `image` N x 3 x 224 x 224, output `logits` N x 1000. BatchNorm is folded
into conv biases as exporters do. Stem 3x3/2 conv + HardSwish, the
MobileNetV3-Small bneck table (1x1 expand, depthwise kxk, optional
squeeze-excite = GlobalAveragePool -> 1x1 conv -> Relu -> 1x1 conv ->
HardSigmoid -> Mul, 1x1 project, residual Add when shapes match) with Relu or
HardSwish, final 1x1 conv + HardSwish, GlobalAveragePool, 1x1 conv + HardSwish,
Flatten and a Gemm classifier.
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import FLOAT, GraphBuilder  # noqa: E402

# kernel, expand, out, squeeze-excite, activation, stride  (MobileNetV3-Small)
BNECK = [
    (3, 16, 16, True, "relu", 2),
    (3, 72, 24, False, "relu", 2),
    (3, 88, 24, False, "relu", 1),
    (5, 96, 40, True, "hswish", 2),
    (5, 240, 40, True, "hswish", 1),
    (5, 240, 40, True, "hswish", 1),
    (5, 120, 48, True, "hswish", 1),
    (5, 144, 48, True, "hswish", 1),
    (5, 288, 96, True, "hswish", 2),
    (5, 576, 96, True, "hswish", 1),
    (5, 576, 96, True, "hswish", 1),
]
LAST_CONV = 576
HEAD = 512
CLASSES = 1000


def make_div(v, d=8):
    n = max(d, int(v + d / 2) // d * d)
    return n + d if n < 0.9 * v else n


# HardSwish roughly halves small activations, so convs feeding it use a larger gain;
# biases are kept small so the logits depend on the features, not on the biases.
GAIN = 1.6
BIAS = 0.01


def squeeze_excite(g, x, c, name):
    h = make_div(c // 4)
    s = g.node("GlobalAveragePool", [x], name=name + ".pool")
    s = g.conv(s, c, h, 1, name + ".fc1", gain=GAIN, bias_std=BIAS)
    s = g.act(s, "relu", name + ".relu")
    s = g.conv(s, h, c, 1, name + ".fc2", gain=GAIN, bias_std=BIAS)
    s = g.act(s, "hsigmoid", name + ".hsigmoid")
    return g.node("Mul", [x, s], name=name + ".mul")


def build():
    g = GraphBuilder("mobilenetv3_small", seed=4001)
    x = g.input("image", FLOAT, ["N", 3, 224, 224])
    x = g.conv(x, 3, 16, 3, "features.0.conv", stride=2, gain=GAIN, bias_std=BIAS)
    x = g.act(x, "hswish", "features.0.act")
    cin = 16
    for i, (k, exp, cout, se, nl, s) in enumerate(BNECK, start=1):
        name = "features.%d" % i
        inp = x
        if exp != cin:
            x = g.conv(x, cin, exp, 1, name + ".expand", gain=GAIN, bias_std=BIAS)
            x = g.act(x, nl, name + ".expand_act")
        x = g.conv(x, exp, exp, k, name + ".dw", stride=s, group=exp, gain=GAIN, bias_std=BIAS)
        x = g.act(x, nl, name + ".dw_act")
        if se:
            x = squeeze_excite(g, x, exp, name + ".se")
        x = g.conv(x, exp, cout, 1, name + ".project", gain=GAIN, bias_std=BIAS)
        if s == 1 and cin == cout:
            x = g.node("Add", [inp, x], name=name + ".add")
        cin = cout
    x = g.conv(x, cin, LAST_CONV, 1, "features.12.conv", gain=GAIN, bias_std=BIAS)
    x = g.act(x, "hswish", "features.12.act")
    x = g.node("GlobalAveragePool", [x], name="avgpool")
    x = g.conv(x, LAST_CONV, HEAD, 1, "classifier.0", gain=GAIN, bias_std=BIAS)
    x = g.act(x, "hswish", "classifier.act")
    x = g.node("Flatten", [x], name="flatten", axis=1)
    w = g.init("classifier.3.weight", g.randn((CLASSES, HEAD), 1.0 / math.sqrt(HEAD)))
    b = g.init("classifier.3.bias", g.randn((CLASSES,), BIAS))
    g.node("Gemm", [x, w, b], name="classifier.3", outputs=["logits"], alpha=1.0, beta=1.0, transB=1)
    g.output("logits", FLOAT, ["N", CLASSES])
    return g.model("MobileNetV3-Small style classifier (random weights)")


def models():
    return {"mobilenetv3.onnx": build}


if __name__ == "__main__":
    import onnx
    onnx.save(build(), os.path.join(sys.argv[1] if len(sys.argv) > 1 else ".", "mobilenetv3.onnx"))
