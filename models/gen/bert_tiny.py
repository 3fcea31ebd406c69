"""Tiny BERT-style encoder generator (bert_tiny.onnx).

Input `input_ids` int64 N x S (both symbolic), output `hidden` float N x S x 128.
2 layers, hidden 128, 2 heads of 64, FFN 512, vocab 1000, max positions 512.
Word embeddings via Gather; positions via Shape -> Gather(1) -> Unsqueeze ->
Slice of an int64 position-id initializer -> Gather of the position table;
LayerNormalization (opset 17 op). Attention is written the way exporters emit
it: Q/K/V MatMul + Add, Shape -> Gather -> Unsqueeze -> Concat -> Reshape to
heads, Transpose, MatMul Q K^T, Div by sqrt(64), Softmax(axis=-1), MatMul V,
Transpose + Reshape back, output projection, residual Add + LayerNormalization,
then an FFN with Erf Gelu x*0.5*(1+Erf(x/sqrt2)) and a second residual LayerNorm.
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import FLOAT, INT64, GraphBuilder  # noqa: E402

VOCAB = 1000
MAX_POS = 512
HIDDEN = 128
HEADS = 2
HEAD_DIM = HIDDEN // HEADS
FFN = 512
LAYERS = 2
EPS = 1e-12


def linear(g, x, din, dout, name):
    w = g.init(name + ".weight", g.randn((din, dout), 1.0 / math.sqrt(din)))
    b = g.init(name + ".bias", g.randn((dout,), 0.02))
    y = g.node("MatMul", [x, w], name=name + ".matmul")
    return g.node("Add", [y, b], name=name + ".add")


def layer_norm(g, x, name, out=None):
    s = g.init(name + ".weight", g.uniform((HIDDEN,), 0.8, 1.2))
    b = g.init(name + ".bias", g.randn((HIDDEN,), 0.02))
    return g.node("LayerNormalization", [x, s, b], name=name, outputs=[out] if out else None,
                  axis=-1, epsilon=EPS)


def build():
    g = GraphBuilder("bert_tiny", seed=5001)
    ids = g.input("input_ids", INT64, ["N", "S"])

    # ---- dynamic dims like exporters produce ----------------------------------
    shape = g.node("Shape", [ids], name="ids.shape")
    c0 = g.const_i("const_0", 0)
    c1 = g.const_i("const_1", 1)
    ax0 = g.const_i("axes_0", [0])
    n_dim = g.node("Gather", [shape, c0], name="dims.n", axis=0)
    s_dim = g.node("Gather", [shape, c1], name="dims.s", axis=0)
    n_1d = g.node("Unsqueeze", [n_dim, ax0], name="dims.n_1d")
    s_1d = g.node("Unsqueeze", [s_dim, ax0], name="dims.s_1d")
    heads_1d = g.const_i("const_heads", [HEADS])
    hd_1d = g.const_i("const_head_dim", [HEAD_DIM])
    hid_1d = g.const_i("const_hidden", [HIDDEN])
    heads_shape = g.node("Concat", [n_1d, s_1d, heads_1d, hd_1d], name="dims.heads_shape", axis=0)
    merge_shape = g.node("Concat", [n_1d, s_1d, hid_1d], name="dims.merge_shape", axis=0)

    # ---- embeddings -------------------------------------------------------------
    wemb = g.init("embeddings.word_embeddings.weight", g.randn((VOCAB, HIDDEN), 0.5))
    pemb = g.init("embeddings.position_embeddings.weight", g.randn((MAX_POS, HIDDEN), 0.5))
    pos_ids = g.init("embeddings.position_ids", np.arange(MAX_POS, dtype=np.int64)[None, :])
    x = g.node("Gather", [wemb, ids], name="embeddings.word", axis=0)
    pos = g.node("Slice", [pos_ids, g.const_i("slice_starts", [0]), s_1d, g.const_i("slice_axes", [1])],
                 name="embeddings.position_ids_slice")
    g.annotate(pos, INT64, [1, "S"])  # Slice ends come from data; give inference the shape
    p = g.node("Gather", [pemb, pos], name="embeddings.position", axis=0)  # 1 x S x H
    x = g.node("Add", [x, p], name="embeddings.add")
    x = layer_norm(g, x, "embeddings.LayerNorm")

    scale = g.const_f("attention.scale", math.sqrt(HEAD_DIM))
    half = g.const_f("gelu.half", 0.5)
    one = g.const_f("gelu.one", 1.0)
    sqrt2 = g.const_f("gelu.sqrt2", math.sqrt(2.0))
    for layer in range(LAYERS):
        pre = "encoder.layer.%d" % layer
        q = linear(g, x, HIDDEN, HIDDEN, pre + ".attention.self.query")
        k = linear(g, x, HIDDEN, HIDDEN, pre + ".attention.self.key")
        v = linear(g, x, HIDDEN, HIDDEN, pre + ".attention.self.value")
        q = g.node("Reshape", [q, heads_shape], name=pre + ".q.reshape")
        k = g.node("Reshape", [k, heads_shape], name=pre + ".k.reshape")
        v = g.node("Reshape", [v, heads_shape], name=pre + ".v.reshape")
        q = g.node("Transpose", [q], name=pre + ".q.transpose", perm=[0, 2, 1, 3])  # N h S d
        k = g.node("Transpose", [k], name=pre + ".k.transpose", perm=[0, 2, 3, 1])  # N h d S
        v = g.node("Transpose", [v], name=pre + ".v.transpose", perm=[0, 2, 1, 3])  # N h S d
        sc = g.node("MatMul", [q, k], name=pre + ".scores")
        sc = g.node("Div", [sc, scale], name=pre + ".scores.div")
        pr = g.node("Softmax", [sc], name=pre + ".softmax", axis=-1)
        ctx = g.node("MatMul", [pr, v], name=pre + ".context")
        ctx = g.node("Transpose", [ctx], name=pre + ".context.transpose", perm=[0, 2, 1, 3])
        ctx = g.node("Reshape", [ctx, merge_shape], name=pre + ".context.reshape")
        o = linear(g, ctx, HIDDEN, HIDDEN, pre + ".attention.output.dense")
        o = g.node("Add", [o, x], name=pre + ".attention.output.residual")
        x = layer_norm(g, o, pre + ".attention.output.LayerNorm")
        h = linear(g, x, HIDDEN, FFN, pre + ".intermediate.dense")
        e = g.node("Div", [h, sqrt2], name=pre + ".gelu.div")
        e = g.node("Erf", [e], name=pre + ".gelu.erf")
        e = g.node("Add", [e, one], name=pre + ".gelu.add")
        h = g.node("Mul", [h, e], name=pre + ".gelu.mul")
        h = g.node("Mul", [h, half], name=pre + ".gelu.mul_half")
        o = linear(g, h, FFN, HIDDEN, pre + ".output.dense")
        o = g.node("Add", [o, x], name=pre + ".output.residual")
        x = layer_norm(g, o, pre + ".output.LayerNorm",
                       out="hidden" if layer == LAYERS - 1 else None)
    g.output("hidden", FLOAT, ["N", "S", HIDDEN])
    return g.model("2-layer BERT-style encoder (random weights), vocab %d" % VOCAB)


def models():
    return {"bert_tiny.onnx": build}


if __name__ == "__main__":
    import onnx
    onnx.save(build(), os.path.join(sys.argv[1] if len(sys.argv) > 1 else ".", "bert_tiny.onnx"))
