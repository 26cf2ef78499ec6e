#!/usr/bin/env python3
"""Flat TCP ring against the hierarchical all_reduce across network-namespace hosts.

Two namespaces pose as hosts of two ranks each (tests/hierarchical/netns_hier.py: a bridge, each
host's eth0 shaped with tc tbf). Measures, in order:
  1. the link's own ceiling: one plain TCP stream from host 1 to host 0, unshaped and at RATE;
  2. f32 all_reduce 4 B .. 64 MiB, flat TCP ring vs hierarchical, ROUNDS interleaved rounds,
     medians of each round's p50 (hier_rank bench), links at RATE (default 10gbit);
  3. at CRATE (default 2gbit): hierarchical all_reduce uncompressed, bf16 and top-k 1% + error
     feedback at 4 and 64 MiB: time, and bytes each host's eth0 sent per call.

usage: netns_bench.py HIER_RANK [--rate 10gbit] [--crate 2gbit] [--rounds 5] [--budget-ms 100]
                          [--env NAME=VALUE]... [--only flat|compress]
Needs root, iproute2 and tc (tbf); prints the tables. Everything it made is removed on exit.
"""

import argparse
import os
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "tests", "hierarchical"))
from netns_hier import Hosts, Skip, start_ranks  # noqa: E402

RECEIVER = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5201)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if t0 is None: t0 = time.monotonic()
    n += len(b)
print(f"{n * 8 / (time.monotonic() - t0) / 1e9:.2f}", flush=True)
"""
SENDER = r"""
import socket, sys, time
s = socket.create_connection((sys.argv[1], 5201)); buf = b"\0" * (1 << 20)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end: s.sendall(buf)
s.close()
"""


def stream_gbps(nets, seconds=3):
    """One TCP stream host 1 -> host 0 for `seconds`: Gbit/s the receiver saw."""
    rx = subprocess.Popen(nets.command(0, [sys.executable, "-c", RECEIVER, nets.addrs[0]]),
                          stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout.readline().strip() == "ready"
        subprocess.run(nets.command(1, [sys.executable, "-c", SENDER, nets.addrs[0], str(seconds)]),
                       check=True, timeout=seconds + 30)
        out, _ = rx.communicate(timeout=30)
        return float(out.strip())
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()


def run_bench(nets, rank_program, args, job, extra):
    j = start_ranks(nets, rank_program, 2, 2, args, job, **extra)
    codes = j.wait_all(300)
    if codes != [0] * 4:
        raise AssertionError(f"exit codes {codes}\n{j.show()}")
    return "".join(l + "\n" for l in j.output(0).splitlines() if not l.startswith("rank 0: connected"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rank_program")
    ap.add_argument("--rate", default="10gbit")
    ap.add_argument("--crate", default="2gbit")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget-ms", default="100")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for every rank")
    ap.add_argument("--only", choices=["flat", "compress"])
    a = ap.parse_args()
    extra = dict(e.split("=", 1) for e in a.env)
    rank_program = os.path.abspath(a.rank_program)
    try:
        nets = Hosts(2)
        start = time.monotonic()
        print(f"link ceiling, one TCP stream host 1 -> host 0, unshaped veth: {stream_gbps(nets):.2f} Gbit/s")
        nets.shape(a.rate)
        print(f"link ceiling at {nets.shaping}: {stream_gbps(nets):.2f} Gbit/s", flush=True)
        if extra:
            print(f"ranks' extra environment: {extra}")
        if a.only != "compress":
            print(f"\n2 hosts x 2 ranks, f32 all_reduce, {a.rounds} interleaved rounds, median of p50s:")
            print(run_bench(nets, rank_program, ["bench", "eth0", str(a.rounds), a.budget_ms],
                            f"nsbench{os.getpid()}a", extra), flush=True)
        if a.only == "flat":
            return 0
        nets.shape(a.crate)
        print(f"link ceiling at {nets.shaping}: {stream_gbps(nets):.2f} Gbit/s")
        print(f"\n2 hosts x 2 ranks, hierarchical all_reduce (avg) at {a.crate}, compressed on the rails:")
        print(run_bench(nets, rank_program, ["bench", "eth0", str(a.rounds), a.budget_ms, "compress"],
                        f"nsbench{os.getpid()}b", extra))
        print(f"total {time.monotonic() - start:.0f} s")
    except Skip as s:
        print(f"SKIP: {s}", file=sys.stderr)
        return 77
    finally:
        if "nets" in locals():
            nets.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
