#!/usr/bin/env python3
"""tests/cli/compare_runs.py: the comparisons the petra-train CLI tests make between two runs.

  compare_runs.py logs A.jsonl B.jsonl EPOCHS LABEL
      the two --log-json logs have EPOCHS epoch lines whose train/test loss and accuracy are equal
      to the last digit (LABEL names run B in the messages)
  compare_runs.py params DIR_A DIR_B TOLERANCE LABEL
      the --save-params directories hold the same parameter files (batch norm's running statistics
      left out: they are per replica by design), equal within TOLERANCE of each tensor's scale

Python's standard library only (no numpy): the .npy files are read with struct.
"""
import ast
import json
import os
import struct
import sys

KEYS = ["train_loss", "train_accuracy", "test_loss", "test_accuracy"]


def epochs(path):
    return [json.loads(line) for line in open(path) if '"epoch"' in line]


def compare_logs(a_path, b_path, count, label):
    a, b = epochs(a_path), epochs(b_path)
    assert len(a) == len(b) == int(count), (len(a), len(b))
    for x, y in zip(a, b):
        for k in KEYS:
            assert x[k] == y[k], f"epoch {x['epoch']} {k}: {x[k]} in {a_path}, {y[k]} in {label}"
        print(f"epoch {x['epoch']}: " + ", ".join(f"{k} {x[k]}" for k in KEYS) + f" (equal in {label})")


def load_npy(path):  # a little-endian float32 or float64 .npy, as petra writes it
    data = open(path, "rb").read()
    n = struct.unpack("<H", data[8:10])[0]
    header = ast.literal_eval(data[10:10 + n].decode())
    code = {"<f4": "f", "<f8": "d"}[header["descr"]]
    count = (len(data) - 10 - n) // struct.calcsize(code)
    return struct.unpack(f"<{count}{code}", data[10 + n:])


def compare_params(a_dir, b_dir, tolerance, label):
    def parameters(d):
        return sorted(f for f in os.listdir(d) if f.endswith(".npy") and "running" not in f and "num_batches" not in f)
    names = parameters(a_dir)
    assert names and names == parameters(b_dir), f"parameter files differ between {a_dir} and {b_dir}"
    worst, exact = 0.0, 0
    for name in names:
        a, b = load_npy(os.path.join(a_dir, name)), load_npy(os.path.join(b_dir, name))
        assert len(a) == len(b), name
        scale = max(max(abs(x) for x in a), 1e-3)
        worst = max(worst, max(abs(x - y) for x, y in zip(a, b)) / scale)
        exact += int(a == b)
    print(f"{label}: {len(names)} parameters, {exact} bit-identical, largest difference {worst:.2e} of the "
          f"parameter's scale")
    assert worst < float(tolerance), f"{label}: {worst:.2e} of the scale, above {tolerance}"


if __name__ == "__main__":
    if len(sys.argv) != 6 or sys.argv[1] not in ("logs", "params"):
        sys.exit(__doc__)
    (compare_logs if sys.argv[1] == "logs" else compare_params)(*sys.argv[2:])
