#!/usr/bin/env python3
"""All_reduce over TCP loopback: cohort's TCP transport against Open MPI's TCP BTL and Gloo's TCP
transport, in interleaved rounds (each round runs every contender once, in a rotated order), so
that all see the same noise from the neighbours on a shared machine. Every contender times with
cohort-bench's method (bench/collectives/measure.hpp): p50 of back-to-back calls, each the
slowest rank's. Prints, per size, the median over rounds of the p50s with their spread.

    bench/tcp/compare_tcp.py --build build --ranks 2 --rounds 5 \\
        --sizes 4,1K,64K,1M,16M,64M [--chrt] [--markdown out.md]

Needs tcp_bench (bench/tcp), cohort-bench-mpi (bench/collectives) and gloo_bench (bench/tcp,
built when libgloo-dev is installed: ninja -C BUILD bench/tcp/gloo_bench); a missing one is left out.
"""

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size_of(text):
    text = text.strip()
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def label(n):
    for suffix, unit in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {suffix}iB"
    return f"{n} B"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env():
    skip = re.compile(r"^(COHORT_|RANK$|WORLD_SIZE$|LOCAL_|MASTER_|TORCHELASTIC_|OMPI_|PMI)")
    return {k: v for k, v in os.environ.items() if not skip.match(k)}


def start_ranks(args_for_rank, env_for_rank, p, limit, stderr=subprocess.STDOUT):
    """Runs ranks 0..p-1 at once; [(exit status, stdout, stderr), ...] by rank. Kills them all
    and raises subprocess.TimeoutExpired after `limit` seconds."""
    procs = [subprocess.Popen(args_for_rank(r), env=env_for_rank(r), stdout=subprocess.PIPE,
                              stderr=stderr, text=True) for r in range(p)]
    out = []
    for pr in procs:
        try:
            out.append((pr, *pr.communicate(timeout=limit)))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    return [(pr.returncode, o, e) for pr, o, e in out]


def gloo_env(r, p, store):
    """The environment of gloo_bench's rank r of p, meeting in the file store `store`."""
    e = clean_env()
    e.update(RANK=str(r), WORLD_SIZE=str(p), GLOO_STORE_DIR=store)
    return e


def run_ranks(args_for_rank, env_for_rank, p, limit):
    done = start_ranks(args_for_rank, env_for_rank, p, limit)
    out = [o for _, o, _ in done]
    if any(rc for rc, _, _ in done):
        raise RuntimeError("a rank failed:\n" + "\n".join(out))
    return "\n".join(out)


def parse(text, pattern):
    return {int(m.group(1)): float(m.group(2)) for m in re.finditer(pattern, text)}


def run_cohort(a, p, sizes, prefix):
    port = free_port()

    def env(r):
        e = clean_env()
        e.update(RANK=str(r), WORLD_SIZE=str(p), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(p),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_RUN_ID=f"cmp{port}")
        return e

    text = run_ranks(lambda r: prefix + [a.tcp_bench, "all_reduce", *map(str, sizes), "--budget-ms", str(a.budget_ms)],
                     env, p, 600)
    return parse(text, r"cohort-tcp all_reduce P=\d+ bytes=(\d+) iters=\d+ p50_us=([\d.]+)")


def run_mpi(a, p, sizes, prefix):
    cmd = [a.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(p), "--mca", "pml", "ob1",
           "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo", *prefix, a.mpi,
           "--sizes", ",".join(map(str, sizes)), "--no-check", "--budget-ms", str(a.budget_ms)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=clean_env())
    if r.returncode:
        raise RuntimeError(r.stdout + r.stderr)
    return parse(r.stdout, r"(?m)^\s+(\d+)\s+\d+\s+\d+\s+([\d.]+)\s")


def run_gloo(a, p, sizes, prefix):
    with tempfile.TemporaryDirectory() as d:
        env = lambda r: gloo_env(r, p, d)
        text = run_ranks(lambda r: prefix + [a.gloo, "--sizes", ",".join(map(str, sizes)),
                                             "--budget-ms", str(a.budget_ms), "--format", "csv",
                                             "--no-check"], env, p, 600)
    return parse(text, r"(?m)^(\d+),\d+,\d+,([\d.]+),")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--ranks", default="2")
    ap.add_argument("--sizes", default="4,1K,64K,1M,16M,64M")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget-ms", type=int, default=100)
    ap.add_argument("--chrt", action="store_true", help="run every rank under chrt -f 1 (root)")
    ap.add_argument("--mpirun", default=shutil.which("mpirun") or "mpirun")
    ap.add_argument("--markdown", help="also write the table here")
    a = ap.parse_args()
    a.tcp_bench = os.path.join(a.build, "bench/tcp/tcp_bench")
    a.mpi = os.path.join(a.build, "bench/collectives/cohort-bench-mpi")
    a.gloo = os.path.join(a.build, "bench/tcp/gloo_bench")
    sizes = [size_of(s) for s in a.sizes.split(",")]
    prefix = ["chrt", "-f", "1"] if a.chrt else []
    contenders = [("cohort", run_cohort)]
    if os.path.exists(a.mpi) and shutil.which(a.mpirun):
        contenders.append(("Open MPI", run_mpi))
    if os.path.exists(a.gloo):
        contenders.append(("Gloo", run_gloo))
    lines = []
    for p in [int(x) for x in a.ranks.split(",")]:
        results = {name: {n: [] for n in sizes} for name, _ in contenders}
        for rnd in range(a.rounds):
            order = contenders[rnd % len(contenders):] + contenders[:rnd % len(contenders)]
            for name, fn in order:
                got = fn(a, p, sizes, prefix)
                for n in sizes:
                    if n in got or (n // 4 * 4) in got:
                        results[name][n].append(got.get(n, got.get(n // 4 * 4)))
            print(f"P={p}: round {rnd + 1} of {a.rounds} done", file=sys.stderr)
        names = [name for name, _ in contenders]
        head = f"| size | " + " | ".join(f"{n} p50 us [min..max]" for n in names)
        head += " | " + " | ".join(f"cohort/{n}" for n in names[1:]) + " | cohort busbw GB/s |"
        lines += [f"\nP={p}, {a.rounds} rounds, all_reduce f32 sum, TCP over loopback"
                  f"{', chrt -f 1' if a.chrt else ''}\n", head, "|" + "---|" * (len(names) * 2 + 1)]
        for n in sizes:
            med = {k: statistics.median(v) if v else float("nan") for k, v in ((k, results[k][n]) for k in names)}
            cells = [f"{med[k]:.1f} [{min(results[k][n]):.1f}..{max(results[k][n]):.1f}]" if results[k][n] else "-"
                     for k in names]
            ratios = [f"{med['cohort'] / med[k]:.2f}" for k in names[1:]]
            busbw = n / (med["cohort"] * 1e-6) * 2 * (p - 1) / p / 1e9
            lines.append(f"| {label(n)} | " + " | ".join(cells) + " | " + " | ".join(ratios) + f" | {busbw:.2f} |")
    text = "\n".join(lines)
    print(text)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
