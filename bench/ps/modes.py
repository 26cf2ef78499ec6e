#!/usr/bin/env python3
"""Accuracy and throughput of the parameter server's modes against all-reduce, as a table.

usage: modes.py TRAIN_PARAMETER_SERVER TRAIN_DATA_PARALLEL [--servers S] [--workers W]
                [--epochs E] [--straggler-ms MS] [--transport shm|tcp] [--repeats R]

For all-reduce (train_data_parallel --ranks W) and each mode (sync, async, ssp:2), with no
straggler and with one worker sleeping MS per step: the final test accuracy, the job's samples/s
(all samples over the time until the last worker finished) and the workers' summed rates (each
worker's own samples over its own time: what the job trains per second while all run).
Medians over R runs.
"""
import argparse
import re
import statistics
import subprocess

p = argparse.ArgumentParser()
p.add_argument("ps")
p.add_argument("dp")
p.add_argument("--servers", type=int, default=1)
p.add_argument("--workers", type=int, default=3)
p.add_argument("--epochs", type=int, default=40)
p.add_argument("--straggler-ms", type=int, default=5)
p.add_argument("--transport", default="shm")
p.add_argument("--repeats", type=int, default=3)
a = p.parse_args()


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout
    acc = float(re.search(r"done: test accuracy ([\d.]+)%", out).group(1))
    job = re.search(r"job: .* ([\d.]+) samples/s", out)
    rates = [float(x) for x in re.findall(r"worker \d+: ([\d.]+) samples/s", out)]
    dp = re.search(r"done: .* in ([\d.]+) s", out)
    return acc, float(job.group(1)) if job else None, sum(rates) if rates else None, out


print(f"S = {a.servers}, W = {a.workers}, {a.transport}, {a.epochs} epochs; "
      f"median of {a.repeats} runs")
print("| run | straggler | test accuracy | job samples/s | summed worker samples/s |")
print("|---|---|---|---|---|")
dp = [run([a.dp, "--ranks", str(a.workers), "--epochs", str(a.epochs),
           "--transport", a.transport]) for _ in range(a.repeats)]
# train_data_parallel prints samples/s per epoch: the job's rate is their median.
dp_rate = statistics.median(
    statistics.median(float(x) for x in re.findall(r"%\s+(\d+) samples/s", r[3])) for r in dp)
print(f"| all_reduce (train_data_parallel --ranks {a.workers}) | none | "
      f"{statistics.median(r[0] for r in dp):.1f}% | {dp_rate:.0f} | |")
for straggler in (0, a.straggler_ms):
    for mode in ("sync", "async", "ssp:2"):
        rs = [run([a.ps, "--servers", str(a.servers), "--workers", str(a.workers),
                   "--mode", mode, "--epochs", str(a.epochs), "--transport", a.transport,
                   "--straggler-ms", str(straggler)]) for _ in range(a.repeats)]
        med = lambda i: statistics.median(r[i] for r in rs)
        print(f"| ps {mode} | {f'{straggler} ms' if straggler else 'none'} | {med(0):.1f}% | "
              f"{med(1):.0f} | {med(2):.0f} |")
