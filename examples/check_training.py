#!/usr/bin/env python3
"""Runs train_data_parallel briefly and checks what it promises.

usage: check_training.py TRAIN_DATA_PARALLEL

With 2 ranks, uncompressed training must reach 95% test accuracy, each compressed run must land
within one percentage point of it, and one blocking all_reduce after back-propagation must give
exactly the overlapped result. Uncompressed training with 1, 2 and 4 ranks (learning rate
scaled by P) must agree within one point. Training is deterministic (fixed seeds,
deterministic collectives), so the figures are repeatable on one machine.
"""
import csv
import os
import subprocess
import sys
import tempfile

program = sys.argv[1]
EPOCHS = 40


def final_accuracy(*args, ranks=2):
    with tempfile.TemporaryDirectory() as tmp:
        curve = os.path.join(tmp, "curve.csv")
        cmd = [program, "--ranks", str(ranks), "--epochs", str(EPOCHS), "--csv", curve, *args]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stderr}")
        with open(curve) as f:
            rows = list(csv.DictReader(f))
        if len(rows) != EPOCHS:
            sys.exit(f"{' '.join(cmd)}: {len(rows)} epochs in the CSV, expected {EPOCHS}")
        return float(rows[-1]["test_accuracy"]), result.stdout


base, out = final_accuracy()
print(out.splitlines()[-1])
if base < 0.95:
    sys.exit(f"uncompressed training reached {base:.3f}, expected at least 0.95")
for spec in ["fp16", "bf16", "int8", "topk:0.01"]:
    acc, out = final_accuracy("--compress", spec)
    print(f"{spec}: {acc:.4f} (uncompressed {base:.4f})")
    if abs(acc - base) > 0.01:
        sys.exit(f"{spec}: accuracy {acc:.4f} is more than 1 point from uncompressed {base:.4f}")
blocking, _ = final_accuracy("--no-overlap")
if blocking != base:
    sys.exit(f"blocking all_reduce gave {blocking}, overlapped {base}: they must agree exactly")
by_ranks = {1: final_accuracy(ranks=1)[0], 2: base, 4: final_accuracy(ranks=4)[0]}
print("  ".join(f"P={p}: {acc:.4f}" for p, acc in by_ranks.items()))
if max(by_ranks.values()) - min(by_ranks.values()) > 0.01:
    sys.exit(f"accuracy over P = 1, 2, 4 spans more than 1 point: {by_ranks}")
print("ok")
