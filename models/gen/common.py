"""Shared helpers for the mtserve reference-model generators.

Provides GraphBuilder (an onnx.helper wrapper that names initializers like a
PyTorch exporter, draws weights from a fixed-seed numpy Generator and stores
them as raw_data via numpy_helper.from_array), conv/BN/activation helpers, model
finalisation (opset 17, IR version 8, onnx.checker), and model_stats(), which
counts GFLOP (2 x MACs of Conv/ConvTranspose/MatMul/Gemm) and initializer bytes
from a shape-inferred copy of the graph with the symbolic dims made concrete.
"""
import hashlib
import math
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference

OPSET = 17
IR_VERSION = 8
FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64


class GraphBuilder:
    """Incrementally builds one ONNX graph with deterministic random weights."""

    def __init__(self, name, seed):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes = []
        self.inits = []
        self.init_names = set()
        self.inputs = []
        self.outputs = []
        self.value_info = []
        self.used = {}

    # ---- naming -------------------------------------------------------------
    def uniq(self, base):
        n = self.used.get(base, 0)
        self.used[base] = n + 1
        return base if n == 0 else "%s_%d" % (base, n)

    # ---- graph I/O ----------------------------------------------------------
    def input(self, name, elem_type, shape):
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def output(self, name, elem_type, shape):
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))

    def annotate(self, name, elem_type, shape):
        """Records an intermediate value_info (shape hint where inference stops)."""
        self.value_info.append(helper.make_tensor_value_info(name, elem_type, shape))

    # ---- initializers -------------------------------------------------------
    def init(self, name, arr):
        """Adds an initializer (raw_data) and returns its (unique) name."""
        name = self.uniq(name)
        assert name not in self.init_names
        self.init_names.add(name)
        arr = np.asarray(arr)
        if not arr.flags.c_contiguous:  # (np.ascontiguousarray would turn 0-d into 1-d)
            arr = arr.copy(order="C")
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def const_f(self, name, values):
        return self.init(name, np.asarray(values, dtype=np.float32))

    def const_i(self, name, values):
        return self.init(name, np.asarray(values, dtype=np.int64))

    def randn(self, shape, std):
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def uniform(self, shape, lo, hi):
        return self.rng.uniform(lo, hi, shape).astype(np.float32)

    # ---- nodes --------------------------------------------------------------
    def node(self, op, inputs, name=None, n_out=1, outputs=None, **attrs):
        """Appends a node; returns its output name (or list when n_out > 1)."""
        nname = self.uniq(name or op)
        if outputs is None:
            outputs = [nname if n_out == 1 else "%s_out%d" % (nname, i) for i in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), list(outputs), name=nname, **attrs))
        return outputs[0] if len(outputs) == 1 else list(outputs)

    def conv(self, x, cin, cout, k, name, stride=1, group=1, pad=None, dilation=1,
             bias=True, gain=math.sqrt(2.0), bias_std=0.05, out=None):
        """Conv with He-style N(0, gain^2/fan_in) weights and small random bias."""
        if pad is None:
            pad = dilation * (k - 1) // 2
        fan_in = (cin // group) * k * k
        w = self.init(name + ".weight", self.randn((cout, cin // group, k, k), gain / math.sqrt(fan_in)))
        ins = [x, w]
        if bias:
            ins.append(self.init(name + ".bias", self.randn((cout,), bias_std)))
        attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)
        if group != 1:
            attrs["group"] = group
        if dilation != 1:
            attrs["dilations"] = [dilation, dilation]
        return self.node("Conv", ins, name=name, outputs=[out] if out else None, **attrs)

    def conv_t(self, x, cin, cout, k, stride, name, gain=1.0):
        """ConvTranspose (no padding), weight layout [cin, cout, k, k]."""
        w = self.init(name + ".weight", self.randn((cin, cout, k, k), gain / math.sqrt(cin)))
        b = self.init(name + ".bias", self.randn((cout,), 0.05))
        return self.node("ConvTranspose", [x, w, b], name=name,
                         kernel_shape=[k, k], strides=[stride, stride])

    def bn(self, x, c, name, eps=1e-5):
        """Inference-mode BatchNormalization with non-trivial random statistics."""
        s = self.init(name + ".weight", self.uniform((c,), 0.6, 1.4))
        b = self.init(name + ".bias", self.randn((c,), 0.1))
        m = self.init(name + ".running_mean", self.randn((c,), 0.1))
        v = self.init(name + ".running_var", self.uniform((c,), 0.5, 1.5))
        return self.node("BatchNormalization", [x, s, b, m, v], name=name, epsilon=eps)

    def act(self, x, kind, name=None):
        if kind == "relu":
            return self.node("Relu", [x], name=name)
        if kind == "lrelu":
            return self.node("LeakyRelu", [x], name=name, alpha=0.1)
        if kind == "hswish":
            return self.node("HardSwish", [x], name=name)
        if kind == "hsigmoid":
            return self.node("HardSigmoid", [x], name=name, alpha=1.0 / 6.0, beta=0.5)
        if kind == "sigmoid":
            return self.node("Sigmoid", [x], name=name)
        raise ValueError(kind)

    def resize(self, x, scale, mode, name, **attrs):
        """Resize (opset 13+ form: X, roi, scales) with a constant scales initializer."""
        sc = self.const_f(name + ".scales", [1.0, 1.0, scale, scale])
        return self.node("Resize", [x, "", sc], name=name, mode=mode, **attrs)

    # ---- finalisation -------------------------------------------------------
    def model(self, doc=""):
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.inits,
                                  value_info=self.value_info)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="mtserve-models-gen", producer_version="1")
        m.ir_version = IR_VERSION
        m.doc_string = doc
        onnx.checker.check_model(m)
        return m


def model_stats(model, dims=None):
    """Returns (flops_per_frame, param_bytes) for batch 1 (N=1, S=64 default).

    FLOPs count 2 x multiply-accumulates of Conv, ConvTranspose, MatMul and Gemm
    only (elementwise/normalisation ops are ignored). Param bytes are the sum of
    all initializer payloads.
    """
    dims = dict({"N": 1, "S": 64}, **(dims or {}))
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info):
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param:
                d.dim_value = dims[d.dim_param]
    m = shape_inference.infer_shapes(m, data_prop=True)
    shapes = {}
    for vi in list(m.graph.input) + list(m.graph.value_info) + list(m.graph.output):
        tt = vi.type.tensor_type
        if tt.HasField("shape"):
            shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    for t in m.graph.initializer:
        shapes[t.name] = list(t.dims)
    param_bytes = sum(len(t.raw_data) if t.raw_data else numpy_helper.to_array(t).nbytes
                      for t in m.graph.initializer)

    def shp(n):
        s = shapes.get(n)
        if s is None or any(v is None for v in s):
            raise RuntimeError("model_stats: unknown shape for %s" % n)
        return s

    macs = 0
    for nd in m.graph.node:
        if nd.op_type == "Conv":
            w = shp(nd.input[1])
            y = shp(nd.output[0])
            macs += int(np.prod(y)) * int(np.prod(w[1:]))
        elif nd.op_type == "ConvTranspose":
            x = shp(nd.input[0])
            w = shp(nd.input[1])
            # w is [Cin, Cout/group, kh, kw]: each input element feeds Cout/group*kh*kw MACs
            macs += int(np.prod(x)) * int(np.prod(w[1:]))
        elif nd.op_type == "MatMul":
            a = shp(nd.input[0])
            y = shp(nd.output[0])
            macs += int(np.prod(y)) * a[-1]
        elif nd.op_type == "Gemm":
            y = shp(nd.output[0])
            b = shp(nd.input[1])
            transb = next((a.i for a in nd.attribute if a.name == "transB"), 0)
            k = b[1] if transb else b[0]
            macs += int(np.prod(y)) * k
    return 2 * macs, param_bytes


def sources_hash(paths):
    """sha256 over the contents of the given generator source files."""
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(os.path.basename(p).encode())
        with open(p, "rb") as f:
            h.update(f.read())
    return h.hexdigest()
