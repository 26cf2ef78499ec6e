#!/usr/bin/env python3
"""Two builds of cohort-bench side by side: where a schedule or a threshold stops paying.

Each build is a Meson build directory of some commit or compile definition, e.g. the commit
before a change and the change itself:

    git worktree add ../cohort-before HEAD~1
    meson setup build-before ../cohort-before --buildtype=release -Dtests=false
    meson setup build-after --buildtype=release -Dtests=false
    ninja -C build-before bench/collectives/cohort-bench tools/cohort-run   # and build-after
    bench/collectives/compare_builds.py --a build-before --b build-after --op all_gather \\
        --transports tcp --ranks 4

Runs the two in interleaved rounds (a then b, then b then a, ...) for every transport and rank
count, and prints, per size (cohort-bench's bytes: the whole output of all_gather and
reduce_scatter's whole input, the buffer otherwise), the median over rounds of each one's p50
and their ratio. Stdlib only; exit status 1 when a run failed its checks.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", required=True, help="the first build directory")
    p.add_argument("--b", required=True, help="the second build directory")
    p.add_argument("--labels", default="a,b", help="what to call the two in the table")
    p.add_argument("--op", default="all_reduce",
                   help="all_reduce, reduce_scatter, all_gather or broadcast")
    p.add_argument("--ranks", default="4", help="rank counts, e.g. 3,4,8")
    p.add_argument("--transports", default="shm,tcp")
    p.add_argument("--sizes", default="4,1K,4K,16K,64K,256K,1M")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--budget-ms", type=int, default=150)
    p.add_argument("--timeout", type=int, default=300, help="seconds per run")
    return p.parse_args(argv)


def command(build, transport, p, a):
    bench = os.path.join(build, "bench", "collectives", "cohort-bench")
    cmd = [bench, "--op", a.op, "--transport", transport, "--sizes", a.sizes,
           "--warmup", "5", "--budget-ms", str(a.budget_ms), "--max-iters", "20000",
           "--format", "json"]
    if transport == "tcp":  # TCP ranks join a job that cohort-run starts
        return [os.path.join(a.a, "tools", "cohort-run"), "-n", str(p)] + cmd
    return cmd + ["--ranks", str(p)]


def run(cmd, timeout):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    # cohort-run prefixes each line of rank r with "[r] "; rank 0 prints the report.
    text = "\n".join(line[4:] if line.startswith("[0] ") else line
                     for line in out.stdout.splitlines() if not line.startswith("[") or
                     line.startswith("[0] "))
    start = text.find("{")
    if out.returncode != 0 or start < 0:
        sys.exit(f"compare_builds: {' '.join(cmd)} failed ({out.returncode}):\n"
                 f"{out.stderr[-2000:]}")
    doc = json.JSONDecoder().raw_decode(text[start:])[0]
    if any(r.get("wrong") for r in doc["results"]):
        sys.exit(f"compare_builds: {' '.join(cmd)} gave wrong results")
    return doc, {r["bytes"]: r["p50_us"] for r in doc["results"]}


def human(n):
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def main(argv):
    a = parse_args(argv)
    la, lb = a.labels.split(",")
    host = None
    for transport in a.transports.split(","):
        for p in (int(x) for x in a.ranks.split(",")):
            times = {"a": {}, "b": {}}
            for i in range(a.rounds):
                for who in (("a", "b") if i % 2 == 0 else ("b", "a")):
                    doc, p50 = run(command(getattr(a, who), transport, p, a), a.timeout)
                    host = host or doc.get("host")
                    for size, t in p50.items():
                        times[who].setdefault(size, []).append(t)
            print(f"\n{a.op}, {transport}, P = {p} ({a.rounds} rounds, median of p50):\n")
            print(f"| size | {la} | {lb} | {lb} / {la} |")
            print("|---|---|---|---|")
            for size in sorted(times["a"]):
                ta, tb = (statistics.median(times[w][size]) for w in ("a", "b"))
                print(f"| {human(size)} | {ta:.2f} us | {tb:.2f} us | {tb / ta:.2f} |")
    print(f"\nhost: {host}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
