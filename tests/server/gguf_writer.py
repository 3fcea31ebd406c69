"""A small GGUF writer (numpy) for the tests: version 3, little-endian, metadata of the scalar,
string and array types, tensors of type F32, F16, BF16 and Q8_0 (blocks of 32: a float16 scale
d = max|x| / 127 and 32 int8 q = round(x / d)).

Also `bert_from_onnx`: the tensors and metadata llama.cpp's converter writes for a BERT encoder,
taken from an ONNX model with the Hugging Face export's initializer names (as
models/gen/minilm_like.py writes them), the vocabulary in the converter's phantom-space spelling.
"""
import struct

import numpy as np

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
T_F32, T_F16, T_Q8_0, T_BF16 = 0, 1, 8, 30
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q",
        I64: "<q", F64: "<d"}


def gstr(s):
    b = s.encode() if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def value(t, v):
    if t == STRING:
        return gstr(v)
    if t == ARRAY:
        et, items = v
        out = struct.pack("<IQ", et, len(items))
        return out + b"".join(value(et, x) for x in items)
    return struct.pack(_FMT[t], v)


def q8_0(a):
    """Q8_0 blocks of a float32 array whose last dimension is a multiple of 32; also returns the
    dequantized values (what a reader must get back)."""
    x = a.astype(np.float32).reshape(-1, 32)
    d = (np.abs(x).max(axis=1) / 127.0).astype(np.float16)
    df = d.astype(np.float32)
    q = np.where(df[:, None] > 0, np.round(x / np.where(df > 0, df, 1)[:, None]), 0).clip(-127, 127).astype(np.int8)
    blocks = np.zeros((x.shape[0], 34), np.uint8)
    blocks[:, :2] = d.view(np.uint8).reshape(-1, 2)
    blocks[:, 2:] = q.view(np.uint8)
    return blocks.tobytes(), (q.astype(np.float32) * df[:, None]).reshape(a.shape)


def bf16(a):
    """bfloat16 bytes of a float32 array (rounded to nearest even) and the values they hold."""
    u = a.astype("<f4").view("<u4").astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
    return r.tobytes(), (r.astype(np.uint32) << 16).view(np.float32).reshape(a.shape)


def tensor_bytes(a, ttype):
    if ttype == T_F32:
        return a.astype("<f4").tobytes()
    if ttype == T_F16:
        return a.astype("<f2").tobytes()
    if ttype == T_Q8_0:
        return q8_0(a)[0]
    if ttype == T_BF16:
        return bf16(a)[0]
    raise ValueError(ttype)


def write(path, kvs, tensors, alignment=32, version=3):
    """kvs: [(key, type, value)]; tensors: [(name, numpy array (row-major, so ggml's ne is the
    reversed shape), ggml type)]."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, v in kvs:
        head += gstr(k) + struct.pack("<I", t) + value(t, v)
    datas, off = [], 0
    infos = b""
    for name, a, tt in tensors:
        ne = list(reversed(a.shape))
        infos += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        infos += struct.pack("<IQ", tt, off)
        d = tensor_bytes(a, tt)
        pad = (-len(d)) % alignment
        datas.append(d + b"\0" * pad)
        off += len(d) + pad
    body = head + infos
    body += b"\0" * ((-len(body)) % alignment)
    with open(path, "wb") as f:
        f.write(body)
        for d in datas:
            f.write(d)


def phantom(tok):
    if tok.startswith("[") and tok.endswith("]"):
        return tok
    return tok[2:] if tok.startswith("##") else "\u2581" + tok


def bert_from_onnx(onnx_path, vocab_path, wtype=T_F32, pooling=1, heads=12, eps=1e-12):
    """(kvs, tensors, reference weights): the GGUF of a BERT export; wtype is the type of the 2-D
    weights (1-D norms and biases stay F32, as llama.cpp's converter keeps them). The reference
    weights are the ONNX initializers as the reader must see them (rounded through float16, or
    Q8_0-dequantized), keyed by ONNX name."""
    import onnx
    from onnx import numpy_helper
    m = onnx.load(str(onnx_path))
    w = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    layers = 1 + max(int(k.split(".")[2]) for k in w if k.startswith("encoder.layer."))
    hidden = w["embeddings.word_embeddings.weight"].shape[1]
    tokens = [line.rstrip("\n") for line in open(vocab_path, encoding="utf-8")]
    if tokens and tokens[-1] == "":
        tokens.pop()
    ttypes = [3 if t.startswith("[") and t.endswith("]") and t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
              else 1 for t in tokens]
    kvs = [("general.architecture", STRING, "bert"), ("general.name", STRING, "minilm_like"),
           ("bert.block_count", U32, layers), ("bert.context_length", U32, w["embeddings.position_embeddings.weight"].shape[0]),
           ("bert.embedding_length", U32, hidden),
           ("bert.feed_forward_length", U32, w["encoder.layer.0.intermediate.dense.weight"].shape[1]),
           ("bert.attention.head_count", U32, heads), ("bert.attention.layer_norm_epsilon", F32, eps),
           ("bert.attention.causal", BOOL, False), ("bert.pooling_type", U32, pooling),
           ("tokenizer.ggml.model", STRING, "bert"), ("tokenizer.ggml.token_type_count", U32, 2),
           ("tokenizer.ggml.tokens", ARRAY, (STRING, [phantom(t) for t in tokens])),
           ("tokenizer.ggml.token_type", ARRAY, (I32, ttypes)),
           ("tokenizer.ggml.unknown_token_id", U32, tokens.index("[UNK]")),
           ("tokenizer.ggml.seperator_token_id", U32, tokens.index("[SEP]")),
           ("tokenizer.ggml.padding_token_id", U32, tokens.index("[PAD]")),
           ("tokenizer.ggml.cls_token_id", U32, tokens.index("[CLS]")),
           ("tokenizer.ggml.mask_token_id", U32, tokens.index("[MASK]"))]
    tensors, ref = [], {}

    def add(gname, oname, a, transposed=False):
        tt = wtype if a.ndim == 2 else T_F32
        tensors.append((gname, a, tt))
        r = a.astype(np.float32)
        if tt == T_F16:
            r = a.astype(np.float16).astype(np.float32)
        elif tt == T_Q8_0:
            r = q8_0(a)[1]
        elif tt == T_BF16:
            r = bf16(a)[1]
        ref[oname] = r.T if transposed else r

    add("token_embd.weight", "embeddings.word_embeddings.weight", w["embeddings.word_embeddings.weight"])
    add("token_types.weight", "embeddings.token_type_embeddings.weight", w["embeddings.token_type_embeddings.weight"])
    add("position_embd.weight", "embeddings.position_embeddings.weight", w["embeddings.position_embeddings.weight"])
    add("token_embd_norm.weight", "embeddings.LayerNorm.weight", w["embeddings.LayerNorm.weight"])
    add("token_embd_norm.bias", "embeddings.LayerNorm.bias", w["embeddings.LayerNorm.bias"])
    names = {"attn_q": "attention.self.query", "attn_k": "attention.self.key", "attn_v": "attention.self.value",
             "attn_output": "attention.output.dense", "attn_output_norm": "attention.output.LayerNorm",
             "ffn_up": "intermediate.dense", "ffn_down": "output.dense", "layer_output_norm": "output.LayerNorm"}
    for layer in range(layers):
        for g, o in names.items():
            for part in ("weight", "bias"):
                on = "encoder.layer.%d.%s.%s" % (layer, o, part)
                a = w[on]
                # ONNX MatMul weights are [in, out]; ggml keeps PyTorch's [out, in] (ne = [in, out])
                add("blk.%d.%s.%s" % (layer, g, part), on, a.T.copy() if a.ndim == 2 else a, a.ndim == 2)
    return kvs, tensors, ref


def onnx_with(onnx_path, ref, out_path):
    """A copy of the ONNX model with the initializers in ref replaced (the weights a GGUF reader
    dequantizes), for comparing a GGUF model with the ONNX model of the very same weights."""
    import onnx
    from onnx import numpy_helper
    m = onnx.load(str(onnx_path))
    for i, t in enumerate(m.graph.initializer):
        if t.name in ref:
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(ref[t.name].astype(np.float32), t.name))
    onnx.save(m, str(out_path))


def tiny_bert(kv=None, tensors=None, wtype=T_F32):
    """(kvs, tensors) of a tiny BERT (hidden 32, 2 heads, 1 layer, 8 tokens), F32; kv and tensors
    replace or drop (value None) metadata keys and tensors by name; wtype: the type of the 2-D
    tensors."""
    rng = np.random.default_rng(7)
    H, F, V, P = 32, 64, 8, 16
    toks = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "\u2581hello", "\u2581world", "s"]
    kvs = [("general.architecture", STRING, "bert"), ("bert.block_count", U32, 1),
           ("bert.embedding_length", U32, H), ("bert.feed_forward_length", U32, F),
           ("bert.attention.head_count", U32, 2), ("bert.attention.layer_norm_epsilon", F32, 1e-12),
           ("bert.pooling_type", U32, 1), ("bert.context_length", U32, P),
           ("tokenizer.ggml.model", STRING, "bert"), ("tokenizer.ggml.tokens", ARRAY, (STRING, toks)),
           ("tokenizer.ggml.token_type", ARRAY, (I32, [3, 3, 3, 3, 3, 1, 1, 1]))]
    r = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.1  # noqa: E731
    ts = [("token_embd.weight", r(V, H)), ("token_types.weight", r(2, H)), ("position_embd.weight", r(P, H)),
          ("token_embd_norm.weight", r(H) + 1), ("token_embd_norm.bias", r(H))]
    for g, (o, i) in {"attn_q": (H, H), "attn_k": (H, H), "attn_v": (H, H), "attn_output": (H, H),
                      "ffn_up": (F, H), "ffn_down": (H, F)}.items():
        ts += [("blk.0.%s.weight" % g, r(o, i)), ("blk.0.%s.bias" % g, r(o))]
    for g in ("attn_output_norm", "layer_output_norm"):
        ts += [("blk.0.%s.weight" % g, r(H) + 1), ("blk.0.%s.bias" % g, r(H))]
    ts = [(n, a, wtype if a.ndim == 2 else T_F32) for n, a in ts]
    kvd = {k: (t, v) for k, t, v in kvs}
    for k, v in (kv or {}).items():
        if v is None:
            kvd.pop(k)
        else:
            kvd[k] = v
    for k, v in (tensors or {}).items():
        ts = [(n, a, t) if n != k else (n, v, T_F32) for n, a, t in ts if not (n == k and v is None)]
    return [(k, t, v) for k, (t, v) in kvd.items()], ts
