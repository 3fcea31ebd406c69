"""Small ONNX models with string graph inputs/outputs, for the KServe BYTES tests
(tests/server/test_bytes.py, tests/grpc/test_bytes_grpc.py):

  strnorm  s: string [N]      -> y: string [M]   StringNormalizer, LOWER, stopwords "the" and "a"
                                                 (case-insensitive)
  f2s      x: float [N, 3]    -> y: string [N, 3] Cast float -> string
  s2f      s: string [N, 2]   -> y: float [N, 2]  Cast string -> float
  mix      s: string [N, K], x: float [N]
                              -> y: string [N, K] (Identity), z: float [N] (x + x)

write(outdir) saves them as NAME.onnx and returns {name: path}. StringNormalizer's locale: the
served model names none (the engine's default, en_US); ONNX Runtime needs that locale installed
to build the op, so oracle(outdir) writes strnorm_oracle.onnx with locale "C" for the reference
run (the tests feed it ASCII text, where the two agree).

usage: string_models.py OUTDIR
"""
import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper


def _save(path, nodes, inputs, outputs):
    g = helper.make_graph(nodes, path.stem, inputs, outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="string_models.py")
    m.ir_version = 7
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


def _strnorm(path, locale=None):
    attrs = dict(case_change_action="LOWER", stopwords=["the", "a"], is_case_sensitive=0)
    if locale:
        attrs["locale"] = locale
    return _save(path, [helper.make_node("StringNormalizer", ["s"], ["y"], **attrs)],
                 [helper.make_tensor_value_info("s", TensorProto.STRING, ["N"])],
                 [helper.make_tensor_value_info("y", TensorProto.STRING, ["M"])])


def write(outdir):
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    S, F = TensorProto.STRING, TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    return {
        "strnorm": _strnorm(out / "strnorm.onnx"),
        "f2s": _save(out / "f2s.onnx", [helper.make_node("Cast", ["x"], ["y"], to=S)],
                     [vi("x", F, ["N", 3])], [vi("y", S, ["N", 3])]),
        "s2f": _save(out / "s2f.onnx", [helper.make_node("Cast", ["s"], ["y"], to=F)],
                     [vi("s", S, ["N", 2])], [vi("y", F, ["N", 2])]),
        "mix": _save(out / "mix.onnx", [helper.make_node("Identity", ["s"], ["y"]),
                                        helper.make_node("Add", ["x", "x"], ["z"])],
                     [vi("s", S, ["N", "K"]), vi("x", F, ["N"])], [vi("y", S, ["N", "K"]), vi("z", F, ["N"])]),
    }


def oracle(outdir):
    return _strnorm(Path(outdir) / "strnorm_oracle.onnx", locale="C")


if __name__ == "__main__":
    for name, p in write(sys.argv[1]).items():
        print(name, p)
    print("strnorm_oracle", oracle(sys.argv[1]))


# Helpers shared by the BYTES tests (tests/server/test_bytes.py, tests/grpc/test_bytes_grpc.py).

def all_paths(outdir):
    """The string models and the StringNormalizer oracle copy written into outdir: {name: path}."""
    paths = write(outdir)
    paths["strnorm_oracle"] = oracle(outdir)
    return paths


def ort(model, inputs):
    """ONNX Runtime's outputs: inputs {name: (type, dims, data)} -> {name: (dims, data)}."""
    import json
    import subprocess
    root = Path(__file__).resolve().parents[2]
    feed = {k: {"type": t, "dims": list(d), "data": list(v)} for k, (t, d, v) in inputs.items()}
    r = subprocess.run(["node", str(root / "tools/ort/ort_strings.js"), str(model)], input=json.dumps(feed),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return {k: (v["dims"], v["data"]) for k, v in json.loads(r.stdout).items()}


def pack(strings):
    """The binary form of BYTES: each element a 4-byte little-endian length and its bytes."""
    out = b""
    for s in strings:
        b = s.encode() if isinstance(s, str) else s
        out += len(b).to_bytes(4, "little") + b
    return out


def unpack(blob):
    """The elements of a binary BYTES tensor (the inverse of pack)."""
    out, off = [], 0
    while off < len(blob):
        n = int.from_bytes(blob[off:off + 4], "little")
        out.append(blob[off + 4:off + 4 + n])
        off += 4 + n
    assert off == len(blob), "binary BYTES output does not end on an element"
    return out
