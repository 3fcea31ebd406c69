"""MiniLM-L6-sized sentence encoder generator (minilm_like.onnx), random weights.

The shape of all-MiniLM-L6-v2 as the Hugging Face ONNX export has it: inputs `input_ids`,
`attention_mask` and `token_type_ids` (int64 N x S, both symbolic), output
`last_hidden_state` float N x S x 384. 6 layers, hidden 384, 12 heads of 32, FFN 1536, BERT's
uncased WordPiece vocabulary size (30522), 512 positions, 2 token types. The attention mask
enters as the export writes it: (1 - mask) * -10000 added to the attention scores, so padded
positions do not change the real tokens' outputs. Served as an embedding model with mean
pooling and L2 normalization (docs/embeddings.md); its vocab.txt comes from
models/gen/bert_vocab.py.
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import FLOAT, INT64, GraphBuilder  # noqa: E402

VOCAB = 30522
MAX_POS = 512
TYPES = 2
HIDDEN = 384
HEADS = 12
HEAD_DIM = HIDDEN // HEADS
FFN = 1536
LAYERS = 6
EPS = 1e-12


def linear(g, x, din, dout, name):
    w = g.init(name + ".weight", g.randn((din, dout), 1.0 / math.sqrt(din)))
    b = g.init(name + ".bias", g.randn((dout,), 0.02))
    y = g.node("MatMul", [x, w], name=name + ".matmul")
    return g.node("Add", [y, b], name=name + ".add")


def layer_norm(g, x, name, out=None, dim=HIDDEN):
    s = g.init(name + ".weight", g.uniform((dim,), 0.8, 1.2))
    b = g.init(name + ".bias", g.randn((dim,), 0.02))
    return g.node("LayerNormalization", [x, s, b], name=name, outputs=[out] if out else None,
                  axis=-1, epsilon=EPS)


def build(vocab=VOCAB, hidden=HIDDEN, heads=HEADS, ffn=FFN, layers=LAYERS, pooled=False, pooler=False,
          name="minilm_like"):
    """The encoder; smaller settings give the unit tests' variants (tests/models). pooled adds a
    second output, the plain mean of last_hidden_state over the sequence axis, computed in the
    graph (a reduction across tokens, which keeps a plan from running padding-free); pooler adds
    BERT's pooler_output, tanh(dense(first token)), the first token taken by a Gather along the
    sequence axis as the exports write it."""
    VOCAB, HIDDEN, HEADS, FFN, LAYERS = vocab, hidden, heads, ffn, layers  # noqa: N806
    HEAD_DIM = HIDDEN // HEADS  # noqa: N806
    g = GraphBuilder(name, seed=5101)
    ids = g.input("input_ids", INT64, ["N", "S"])
    mask = g.input("attention_mask", INT64, ["N", "S"])
    types = g.input("token_type_ids", INT64, ["N", "S"])

    shape = g.node("Shape", [ids], name="ids.shape")
    c0 = g.const_i("const_0", 0)
    c1 = g.const_i("const_1", 1)
    ax0 = g.const_i("axes_0", [0])
    n_dim = g.node("Gather", [shape, c0], name="dims.n", axis=0)
    s_dim = g.node("Gather", [shape, c1], name="dims.s", axis=0)
    n_1d = g.node("Unsqueeze", [n_dim, ax0], name="dims.n_1d")
    s_1d = g.node("Unsqueeze", [s_dim, ax0], name="dims.s_1d")
    heads_shape = g.node("Concat", [n_1d, s_1d, g.const_i("const_heads", [HEADS]),
                                    g.const_i("const_head_dim", [HEAD_DIM])], name="dims.heads_shape", axis=0)
    merge_shape = g.node("Concat", [n_1d, s_1d, g.const_i("const_hidden", [HIDDEN])],
                         name="dims.merge_shape", axis=0)

    # ---- extended attention mask: (1 - mask) * -10000, N x 1 x 1 x S ----------------------
    mf = g.node("Cast", [mask], name="mask.cast", to=FLOAT)
    mf = g.node("Unsqueeze", [mf, g.const_i("mask.axes", [1, 2])], name="mask.unsqueeze")
    mf = g.node("Sub", [g.const_f("mask.one", 1.0), mf], name="mask.invert")
    bias = g.node("Mul", [mf, g.const_f("mask.neg", -10000.0)], name="mask.bias")

    # ---- embeddings -------------------------------------------------------------------------
    wemb = g.init("embeddings.word_embeddings.weight", g.randn((VOCAB, HIDDEN), 0.5))
    pemb = g.init("embeddings.position_embeddings.weight", g.randn((MAX_POS, HIDDEN), 0.5))
    temb = g.init("embeddings.token_type_embeddings.weight", g.randn((TYPES, HIDDEN), 0.5))
    pos_ids = g.init("embeddings.position_ids", np.arange(MAX_POS, dtype=np.int64)[None, :])
    x = g.node("Gather", [wemb, ids], name="embeddings.word", axis=0)
    t = g.node("Gather", [temb, types], name="embeddings.token_type", axis=0)
    pos = g.node("Slice", [pos_ids, g.const_i("slice_starts", [0]), s_1d, g.const_i("slice_axes", [1])],
                 name="embeddings.position_ids_slice")
    g.annotate(pos, INT64, [1, "S"])
    p = g.node("Gather", [pemb, pos], name="embeddings.position", axis=0)
    x = g.node("Add", [x, t], name="embeddings.add_type")
    x = g.node("Add", [x, p], name="embeddings.add")
    x = layer_norm(g, x, "embeddings.LayerNorm", dim=HIDDEN)

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
        q = g.node("Transpose", [q], name=pre + ".q.transpose", perm=[0, 2, 1, 3])
        k = g.node("Transpose", [k], name=pre + ".k.transpose", perm=[0, 2, 3, 1])
        v = g.node("Transpose", [v], name=pre + ".v.transpose", perm=[0, 2, 1, 3])
        sc = g.node("MatMul", [q, k], name=pre + ".scores")
        sc = g.node("Div", [sc, scale], name=pre + ".scores.div")
        sc = g.node("Add", [sc, bias], name=pre + ".scores.mask")
        pr = g.node("Softmax", [sc], name=pre + ".softmax", axis=-1)
        ctx = g.node("MatMul", [pr, v], name=pre + ".context")
        ctx = g.node("Transpose", [ctx], name=pre + ".context.transpose", perm=[0, 2, 1, 3])
        ctx = g.node("Reshape", [ctx, merge_shape], name=pre + ".context.reshape")
        o = linear(g, ctx, HIDDEN, HIDDEN, pre + ".attention.output.dense")
        o = g.node("Add", [o, x], name=pre + ".attention.output.residual")
        x = layer_norm(g, o, pre + ".attention.output.LayerNorm", dim=HIDDEN)
        h = linear(g, x, HIDDEN, FFN, pre + ".intermediate.dense")
        e = g.node("Div", [h, sqrt2], name=pre + ".gelu.div")
        e = g.node("Erf", [e], name=pre + ".gelu.erf")
        e = g.node("Add", [e, one], name=pre + ".gelu.add")
        h = g.node("Mul", [h, e], name=pre + ".gelu.mul")
        h = g.node("Mul", [h, half], name=pre + ".gelu.mul_half")
        o = linear(g, h, FFN, HIDDEN, pre + ".output.dense")
        o = g.node("Add", [o, x], name=pre + ".output.residual")
        x = layer_norm(g, o, pre + ".output.LayerNorm",
                       out="last_hidden_state" if layer == LAYERS - 1 else None, dim=HIDDEN)
    g.output("last_hidden_state", FLOAT, ["N", "S", HIDDEN])
    if pooler:
        first = g.node("Gather", [x, g.const_i("pooler.index", 0)], name="pooler.first_token", axis=1)
        w = g.init("pooler.dense.weight", g.randn((HIDDEN, HIDDEN), 1.0 / math.sqrt(HIDDEN)))
        b = g.init("pooler.dense.bias", g.randn((HIDDEN,), 0.02))
        d = g.node("Gemm", [first, w, b], name="pooler.dense")
        g.node("Tanh", [d], name="pooler.tanh", outputs=["pooler_output"])
        g.output("pooler_output", FLOAT, ["N", HIDDEN])
    if pooled:
        g.node("ReduceMean", [x], name="pooled.mean", outputs=["pooled"], axes=[1], keepdims=0)
        g.output("pooled", FLOAT, ["N", HIDDEN])
    return g.model("6-layer MiniLM-sized sentence encoder (random weights), vocab %d" % VOCAB)


def models():
    return {"minilm_like.onnx": build}


if __name__ == "__main__":
    import onnx
    onnx.save(build(), os.path.join(sys.argv[1] if len(sys.argv) > 1 else ".", "minilm_like.onnx"))
