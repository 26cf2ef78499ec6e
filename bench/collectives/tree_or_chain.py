#!/usr/bin/env python3
"""Where broadcast's binomial tree stops paying: the tree against the pipelined chain.

Needs two builds of cohort-bench, one that always runs the tree and one that always runs the
chain, made with the compile definition that forces the schedule (cohort/collectives/detail/
tuning.hpp):

    meson setup build-tree  --buildtype=release -Dcpp_args=-DCOHORT_BROADCAST_SCHEDULE=1
    meson setup build-chain --buildtype=release -Dcpp_args=-DCOHORT_BROADCAST_SCHEDULE=2
    ninja -C build-tree bench/collectives/cohort-bench tools/cohort-run
    ninja -C build-chain bench/collectives/cohort-bench
    bench/collectives/tree_or_chain.py --tree build-tree --chain build-chain --ranks 3,4,8

Runs the two in interleaved rounds (tree then chain, then chain then tree, ...) for every
transport and rank count, and prints, per size, the median over rounds of each one's p50 and
their ratio. Where tree / chain stays under 1 is where broadcast should run the tree
(`tuning::tree_broadcast_bytes` and the rule beside it). Stdlib only; exit status 1 when a run failed its checks.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", required=True, help="build whose broadcast always runs the tree")
    p.add_argument("--chain", required=True, help="build whose broadcast always runs the chain")
    p.add_argument("--ranks", default="3,4", help="rank counts, e.g. 3,4,8")
    p.add_argument("--transports", default="shm,tcp")
    p.add_argument("--sizes", default="4,256,1K,4K,8K,16K,32K,64K,256K,1M")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--budget-ms", type=int, default=150)
    p.add_argument("--timeout", type=int, default=300, help="seconds per run")
    return p.parse_args(argv)


def command(build, transport, p, a):
    bench = os.path.join(build, "bench", "collectives", "cohort-bench")
    cmd = [bench, "--op", "broadcast", "--transport", transport, "--sizes", a.sizes,
           "--warmup", "5", "--budget-ms", str(a.budget_ms), "--max-iters", "20000",
           "--format", "json"]
    if transport == "tcp":  # TCP ranks join a job that cohort-run starts
        return [os.path.join(a.tree, "tools", "cohort-run"), "-n", str(p)] + cmd
    return cmd + ["--ranks", str(p)]


def run(cmd, timeout):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    # cohort-run prefixes each line of rank r with "[r] "; rank 0 prints the report.
    text = "\n".join(line[4:] if line.startswith("[0] ") else line
                     for line in out.stdout.splitlines() if not line.startswith("[") or
                     line.startswith("[0] "))
    start = text.find("{")
    if out.returncode != 0 or start < 0:
        sys.exit(f"tree_or_chain: {' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    doc = json.JSONDecoder().raw_decode(text[start:])[0]
    if any(r.get("wrong") for r in doc["results"]):
        sys.exit(f"tree_or_chain: {' '.join(cmd)} gave wrong results")
    return doc, {r["bytes"]: r["p50_us"] for r in doc["results"]}


def human(n):
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def main(argv):
    a = parse_args(argv)
    host = None
    for transport in a.transports.split(","):
        for p in (int(x) for x in a.ranks.split(",")):
            times = {"tree": {}, "chain": {}}
            for i in range(a.rounds):
                order = ("tree", "chain") if i % 2 == 0 else ("chain", "tree")
                for who in order:
                    doc, p50 = run(command(getattr(a, who), transport, p, a), a.timeout)
                    host = host or doc.get("host")
                    for size, t in p50.items():
                        times[who].setdefault(size, []).append(t)
            print(f"\n{transport}, P = {p} ({a.rounds} rounds, median of p50):\n")
            print("| size | tree | chain | tree / chain |")
            print("|---|---|---|---|")
            for size in sorted(times["tree"]):
                t, c = (statistics.median(times[w][size]) for w in ("tree", "chain"))
                print(f"| {human(size)} | {t:.2f} us | {c:.2f} us | {t / c:.2f} |")
    print(f"\nhost: {host}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
