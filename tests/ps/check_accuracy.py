#!/usr/bin/env python3
"""Trains the digits MLP through the parameter server and by all-reduce, and compares.

usage: check_accuracy.py TRAIN_PARAMETER_SERVER TRAIN_DATA_PARALLEL [--full]

At equal epochs, sync mode must land within 0.5 point of all-reduce with P = W ranks, async
and ssp(2) within 2 points. The quick run covers S = 2, W = 2 over shm and sync over TCP;
--full covers S = 1, 2 by W = 2, 4 in every mode, and a straggler. Every run is bounded.
"""
import csv
import os
import subprocess
import sys
import tempfile

ps_program, dp_program = sys.argv[1], sys.argv[2]
full = "--full" in sys.argv[3:]
EPOCHS = 40


def final_accuracy(cmd):
    with tempfile.TemporaryDirectory() as tmp:
        curve = os.path.join(tmp, "curve.csv")
        cmd = [*cmd, "--epochs", str(EPOCHS), "--csv", curve]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stderr}")
        with open(curve) as f:
            rows = list(csv.DictReader(f))
        if len(rows) != EPOCHS:
            sys.exit(f"{' '.join(cmd)}: {len(rows)} epochs in the CSV, expected {EPOCHS}")
        return 100 * float(rows[-1]["test_accuracy"])


cases = [(2, 2, "shm", 0), (2, 2, "tcp", 0)]
if full:
    cases = [(s, w, "shm", 0) for s in (1, 2) for w in (2, 4)] + [(2, 2, "tcp", 0), (1, 3, "shm", 3)]
baseline = {}
failed = []
for servers, workers, transport, straggler in cases:
    if workers not in baseline:
        baseline[workers] = final_accuracy([dp_program, "--ranks", str(workers)])
    base = baseline[workers]
    modes = ["sync", "async", "ssp:2"] if transport == "shm" else ["sync"]
    for mode in modes:
        acc = final_accuracy([ps_program, "--servers", str(servers), "--workers", str(workers),
                              "--mode", mode, "--transport", transport,
                              "--straggler-ms", str(straggler)])
        bound = 0.5 if mode == "sync" else 2.0
        ok = abs(acc - base) <= bound
        print(f"S={servers} W={workers} {transport} {mode:6} straggler {straggler} ms: "
              f"{acc:.2f}% (all-reduce P={workers}: {base:.2f}%, bound {bound}) "
              f"{'ok' if ok else 'FAILED'}")
        if not ok:
            failed.append(f"S={servers} W={workers} {mode}")
if failed:
    sys.exit("outside the bound: " + ", ".join(failed))
