#!/usr/bin/python3
"""Writes a KServe v2 binary-extension inference request body for a model with random float32
inputs: a JSON header naming each input with parameters.binary_data_size, followed by the raw
little-endian tensors. Prints the JSON header length (for the Inference-Header-Content-Length
header). Usage: make_infer_body.py OUT.bin NAME:d0,d1,... [NAME:dims ...]
"""
import json
import sys

import numpy as np


def main():
    out = sys.argv[1]
    rng = np.random.default_rng(3)
    inputs, blobs = [], []
    for spec in sys.argv[2:]:
        name, dims = spec.split(":")
        shape = [int(d) for d in dims.split(",")]
        data = rng.random(shape, dtype=np.float32)
        blobs.append(data.tobytes())
        inputs.append({"name": name, "shape": shape, "datatype": "FP32",
                       "parameters": {"binary_data_size": len(blobs[-1])}})
    header = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}).encode()
    with open(out, "wb") as f:
        f.write(header)
        for b in blobs:
            f.write(b)
    print(len(header))


if __name__ == "__main__":
    main()
