#!/usr/bin/env python3
"""Compare cohort with its peers, Open MPI and Gloo, cell by cell, on one host.

A cell is (collective, P, transport, scheduler, size). Every round runs, for each group of
cells (collective, P, transport, scheduler), cohort-bench, cohort-bench-mpi and gloo_bench once
each, in an order rotated from round to round, so that all see the same noise from the
neighbours on a shared machine. All three time with bench/collectives/measure.hpp's method
(barrier, back-to-back calls, the slowest rank's time per call, p50) and check one call per
size. Per cell it takes the median over rounds of the p50s and reports the time ratios
cohort/Open MPI and cohort/Gloo (below 1: cohort is faster), against the goals (at most 1.0x
Open MPI, at most 0.67x Gloo); it writes the table as Markdown, the cells as CSV, the ratios
as an SVG plot (stdlib only), and prints the worst cell of each collective against each peer.

    bench/compare_peers.py --build BUILD [--ranks 2,4] [--transports shm,tcp] \\
        [--ops all_reduce,...] [--sizes 4,64,1K,...] [--rounds 5] \\
        [--markdown t.md] [--csv t.csv] [--plot t.svg] [--raw raw.jsonl]
    bench/compare_peers.py --quick --ranks 2 --sizes 4,1K,1M ...    (one round, small budget)
    bench/compare_peers.py --replay raw.jsonl --markdown t.md ...   (runs nothing)

The peers per transport: shm -- Open MPI with btl self,vader; Gloo over TCP loopback (Gloo has
no shared-memory transport, so this is what a Gloo user gets on one host). tcp -- Open MPI with
btl self,tcp on lo; Gloo over TCP loopback; cohort's TCP transport under cohort-run.
Schedulers: "default", and "fifo" (every rank under chrt -f 1) where compare.py allows it: as
root, where chrt works, and only when P <= cpus (FIFO spinners would starve each other).

Needs, from the build: bench/collectives/cohort-bench, cohort-bench-mpi (with mpirun),
tools/cohort-run (tcp), bench/tcp/gloo_bench (libgloo-dev). A missing peer is left out.
Exit status 0 when every run passed its checks, 1 otherwise.
"""

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "collectives"), os.path.join(HERE, "tcp")]
import compare  # noqa: E402  (bench/collectives/compare.py)
from compare_tcp import gloo_env, size_of, start_ranks  # noqa: E402  (bench/tcp/compare_tcp.py)

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")
PEERS = {"mpi": "Open MPI", "gloo": "Gloo"}
GOALS = {"mpi": 1.0, "gloo": 0.67}  # the most cohort's time may be, as a fraction of the peer's
BTL = {"shm": "vader", "tcp": "tcp"}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build-bench", help="Meson build directory")
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--transports", default="shm,tcp")
    p.add_argument("--schedulers", default="default,fifo",
                   help="default and/or fifo (chrt -f 1, where allowed; see above)")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--sizes", default="4,64,1K,16K,256K,1M,16M,64M")
    p.add_argument("--peers", default="mpi,gloo")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--budget-ms", type=int, default=200)
    p.add_argument("--min-iters", type=int, default=10)
    p.add_argument("--max-iters", type=int, default=10000)
    p.add_argument("--quick", action="store_true",
                   help="smoke run: one round, 1 warmup, 5 ms per size, 2..50 calls")
    p.add_argument("--markdown", help="write the table here")
    p.add_argument("--csv", help="write the cells here")
    p.add_argument("--plot", help="write the ratio plot here (SVG)")
    p.add_argument("--raw", help="write every run's JSON document here, one per line")
    p.add_argument("--replay", metavar="RAW", help="run nothing: redraw from an earlier --raw")
    p.add_argument("--run-timeout", type=float, default=600, help="seconds per run")
    p.add_argument("--require-peers", action="store_true",
                   help="exit 77 (skipped, for Meson) when a peer is missing, not leave it out")
    a = p.parse_args(argv)
    if a.quick:
        a.rounds, a.warmup, a.budget_ms, a.min_iters, a.max_iters = 1, 1, 5, 2, 50
    a.ranks = [int(r) for r in a.ranks.split(",")]
    a.transports, a.ops = a.transports.split(","), a.ops.split(",")
    a.schedulers, a.peers = a.schedulers.split(","), [w for w in a.peers.split(",") if w]
    a.sizes = ",".join(str(size_of(s)) for s in a.sizes.split(","))
    if a.rounds < 1 or not set(a.transports) <= set(BTL) or not set(a.ops) <= set(OPS) \
            or not set(a.peers) <= set(PEERS) or not set(a.schedulers) <= {"default", "fifo"}:
        p.error("bad --rounds, --transports, --ops, --peers or --schedulers")
    exe = lambda *parts: os.path.join(a.build, *parts)
    a.cohort = exe("bench", "collectives", "cohort-bench")
    a.mpi = exe("bench", "collectives", "cohort-bench-mpi")
    a.cohort_run = exe("tools", "cohort-run")
    a.gloo = exe("bench", "tcp", "gloo_bench")
    return a


def compare_args(a, op, transport, sched):
    """compare.py's options for one group of cells (its commands() builds cohort's and MPI's)."""
    return argparse.Namespace(
        op=op, dtype="f32", reduce="sum", sizes=a.sizes, warmup=a.warmup, budget_ms=a.budget_ms,
        min_iters=a.min_iters, max_iters=a.max_iters, transport=transport,
        mpi_btl=BTL[transport], mpirun=a.mpirun, cohort=a.cohort, mpi=a.mpi,
        chrt="auto" if sched == "fifo" else "off")


def group_commands(a, p, op, transport, sched):
    """{contender: argv} for one group, or None where the scheduler does not apply."""
    ca = compare_args(a, op, transport, sched)
    prefix = compare.chrt_prefix(ca, p)
    if sched == "fifo" and not prefix:
        return None
    ca.chrt = "off"
    cmds = compare.commands(ca, p)
    if transport == "tcp":  # cohort's TCP ranks join a job that cohort-run starts
        cmds["cohort"] = [a.cohort_run, "-n", str(p)] + cmds["cohort"]
    gloo = [a.gloo] + cmds["mpi"][cmds["mpi"].index(a.mpi) + 1:]  # the same benchmark options
    out = {"cohort": prefix + cmds["cohort"], "mpi": prefix + cmds["mpi"], "gloo": prefix + gloo}
    return {who: cmd for who, cmd in out.items() if who == "cohort" or who in a.peers}


def run_gloo(cmd, p, timeout):
    """Starts the P ranks of gloo_bench (a file store in a fresh directory); rank 0's JSON."""
    with tempfile.TemporaryDirectory() as store:
        try:
            outs = start_ranks(lambda r: cmd, lambda r: gloo_env(r, p, store), p, timeout, stderr=subprocess.PIPE)
        except subprocess.TimeoutExpired:
            sys.exit(f"compare_peers.py: timed out after {timeout} s: {' '.join(cmd)}")
    try:
        return json.loads(outs[0][1])
    except json.JSONDecodeError:
        sys.exit(f"compare_peers.py: no JSON from {' '.join(cmd)}:\n"
                 + "\n".join(err for _, _, err in outs))


def wrong(doc):
    return any(r["wrong"] not in (0, None) for r in doc["results"])


def collect(a, raw):
    """Runs the rounds; returns ([record, ...], failed). A record is what --raw holds."""
    records, failed = [], False
    for rnd in range(a.rounds):
        for p in a.ranks:
            for transport in a.transports:
                for sched in a.schedulers:
                    for op in a.ops:
                        cmds = group_commands(a, p, op, transport, sched)
                        if cmds is None:
                            continue
                        order = list(cmds)
                        order = order[rnd % len(order):] + order[:rnd % len(order)]
                        for who in order:
                            print(f"round {rnd + 1}/{a.rounds}: {op} P={p} {transport} {sched}: "
                                  f"{who}", file=sys.stderr)
                            doc = (run_gloo(cmds[who], p, a.run_timeout) if who == "gloo"
                                   else compare.run_once(cmds[who], a.run_timeout))
                            rec = {"round": rnd + 1, "ranks": p, "transport": transport,
                                   "scheduler": sched, "op": op, "contender": who,
                                   "command": cmds[who], "result": doc}
                            if raw:
                                raw.write(json.dumps(rec) + "\n")
                                raw.flush()
                            failed |= wrong(doc)
                            records.append(rec)
    return records, failed


def replay(path):
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return records, any(wrong(r["result"]) for r in records)


def cells(records):
    """One dict per cell: the key fields, and per contender the median p50 over rounds with its
    spread, and the ratios cohort/peer."""
    times = {}
    for rec in records:
        for r in rec["result"]["results"]:
            key = (OPS.index(rec["op"]), rec["ranks"], rec["transport"], rec["scheduler"],
                   r["bytes"])
            times.setdefault(key, {}).setdefault(rec["contender"], []).append(r["p50_us"])
    rows = []
    for key in sorted(times):
        op, p, transport, sched, nbytes = key
        row = {"op": OPS[op], "ranks": p, "transport": transport, "scheduler": sched,
               "bytes": nbytes}
        for who in ("cohort", *PEERS):
            med, lo, hi = compare.spread(times[key][who]) if who in times[key] else (None,) * 3
            row.update({f"{who}_p50_us": med, f"{who}_p50_us_min": lo, f"{who}_p50_us_max": hi,
                        f"{who}_rounds": len(times[key].get(who, []))})
        for peer in PEERS:
            c, q = row["cohort_p50_us"], row[f"{peer}_p50_us"]
            row[f"cohort/{peer}"] = c / q if c is not None and q else None
        rows.append(row)
    return rows


def fmt_ratio(x, peer):
    if x is None:
        return "-"
    return f"{x:.2f}" + (" !" if x > GOALS[peer] else "")


def table(rows, peers, title):
    us = lambda v: "-" if v is None else compare.human_us(v)
    head = ["collective", "P", "transport", "scheduler", "size", "cohort us"]
    head += [f"{PEERS[q]} us" for q in peers] + [f"cohort/{PEERS[q]}" for q in peers]
    lines = [f"{title}\n", "| " + " | ".join(head) + " |",
             "|" + "---|" * 5 + "---:|" * (1 + 2 * len(peers))]
    for r in rows:
        cells_ = [r["op"], str(r["ranks"]), r["transport"], r["scheduler"],
                  compare.human_bytes(r["bytes"]), us(r["cohort_p50_us"])]
        cells_ += [us(r[f"{q}_p50_us"]) for q in peers]
        cells_ += [fmt_ratio(r[f"cohort/{q}"], q) for q in peers]
        lines.append("| " + " | ".join(cells_) + " |")
    return "\n".join(lines)


def worst_cells(rows, peers):
    """Per collective and peer, the cell with the highest ratio cohort/peer."""
    lines = []
    for op in OPS:
        for q in peers:
            rs = [r for r in rows if r["op"] == op and r[f"cohort/{q}"] is not None]
            if not rs:
                continue
            w = max(rs, key=lambda r: r[f"cohort/{q}"])
            x = w[f"cohort/{q}"]
            met = sum(r[f"cohort/{q}"] <= GOALS[q] for r in rs)
            lines.append(f"{op} vs {PEERS[q]}: worst {x:.2f}x (goal <= {GOALS[q]}x"
                         f"{', missed' if x > GOALS[q] else ', met'}) at P={w['ranks']} "
                         f"{w['transport']} {w['scheduler']} {compare.human_bytes(w['bytes'])}; "
                         f"{met} of {len(rs)} cells meet the goal")
    return lines


def plot_svg(path, rows, peers, title):
    """The ratios against size, a panel per collective, a line per (peer, P, transport,
    scheduler), the goals dashed. Plain SVG, no plotting library."""
    W, H, cols, pad = 560, 380, 2, 50
    sizes = sorted({r["bytes"] for r in rows})
    ratios = [r[f"cohort/{q}"] for r in rows for q in peers if r[f"cohort/{q}"]]
    top = max([1.2] + ratios) * 1.05
    lx0, lx1 = math.log2(sizes[0]), math.log2(sizes[-1]) or 1
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
              "#7f7f7f"]
    esc = lambda t: t.replace("&", "&amp;").replace("<", "&lt;")
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W * cols}" '
           f'height="{H * 2 + 30}" font-family="sans-serif" font-size="11">',
           f'<text x="10" y="18" font-size="14">{esc(title)}</text>']
    series_keys = sorted({(q, r["ranks"], r["transport"], r["scheduler"]) for r in rows
                          for q in peers if r[f"cohort/{q}"] is not None})
    for i, op in enumerate(OPS):
        ox, oy = (i % cols) * W, 30 + (i // cols) * H
        x0, y0, x1, y1 = ox + pad, oy + H - pad, ox + W - 10, oy + 20
        X = lambda b: x0 + (x1 - x0) * ((math.log2(b) - lx0) / ((lx1 - lx0) or 1))
        Y = lambda v: y0 - (y0 - y1) * min(v, top) / top
        out += [f'<text x="{x0}" y="{y1 - 6}" font-size="13">{op}: cohort time / peer time</text>',
                f'<rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" fill="none" '
                f'stroke="#888"/>']
        for b in sizes:
            out.append(f'<text x="{X(b):.1f}" y="{y0 + 14}" text-anchor="middle">'
                       f'{esc(compare.human_bytes(b))}</text>')
        for v in [k / 4 for k in range(0, int(top * 4) + 1)]:
            out.append(f'<text x="{x0 - 4}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
        for q in peers:
            out.append(f'<line x1="{x0}" x2="{x1}" y1="{Y(GOALS[q]):.1f}" y2="{Y(GOALS[q]):.1f}" '
                       f'stroke="#444" stroke-dasharray="4,3"/><text x="{x1 - 2}" '
                       f'y="{Y(GOALS[q]) - 3:.1f}" text-anchor="end">goal vs {PEERS[q]}</text>')
        for k, (q, p, transport, sched) in enumerate(series_keys):
            pts = [(X(r["bytes"]), Y(r[f"cohort/{q}"])) for r in rows
                   if r["op"] == op and (r["ranks"], r["transport"], r["scheduler"]) ==
                   (p, transport, sched) and r[f"cohort/{q}"] is not None]
            if not pts:
                continue
            color, dash = colors[k % len(colors)], "" if q == "mpi" else ' stroke-dasharray="6,2"'
            out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5"{dash} '
                       f'points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in pts)}"/>')
            if i == 0:
                out.append(f'<text x="{x0 + 6}" y="{y1 + 14 + 12 * k}" fill="{color}">'
                           f'vs {PEERS[q]}, P={p}, {transport}, {sched}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main(argv):
    a = parse_args(argv)
    if a.replay:
        records, failed = replay(a.replay)
    else:
        need = [a.cohort] + ([a.cohort_run] if "tcp" in a.transports else [])
        for exe in need:
            if not os.access(exe, os.X_OK):
                sys.exit(f"compare_peers.py: {exe} is not an executable (see --build)")
        for q, exe in (("mpi", a.mpi), ("gloo", a.gloo)):
            missing = not os.access(exe, os.X_OK) or (q == "mpi" and not shutil.which(a.mpirun))
            if q in a.peers and missing and a.require_peers:
                print(f"compare_peers.py: no {PEERS[q]} peer ({exe}); skipped", file=sys.stderr)
                return 77
            if q in a.peers and missing:
                print(f"compare_peers.py: no {PEERS[q]} peer ({exe}); left out", file=sys.stderr)
                a.peers.remove(q)
        raw = open(a.raw, "w") if a.raw else None
        try:
            records, failed = collect(a, raw)
        finally:
            if raw:
                raw.close()
    rows = cells(records)
    peers = [q for q in PEERS if any(r[f"cohort/{q}"] is not None for r in rows)]
    rounds = max(r["round"] for r in records)
    host = records[0]["result"]["host"]
    title = (f"p50 time per call, median of {rounds} interleaved round(s); host: {host}; "
             f"\"!\": the ratio misses its goal (cohort/Open MPI <= {GOALS['mpi']}, "
             f"cohort/Gloo <= {GOALS['gloo']})")
    text = table(rows, peers, title)
    worst = worst_cells(rows, peers)
    print("\n" + text + "\n\nworst cells:\n  " + "\n  ".join(worst))
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text + "\n\nWorst cells:\n\n" + "".join(f"- {w}\n" for w in worst))
        print(f"\nmarkdown: {a.markdown}")
    if a.csv:
        compare.write_csv(a.csv, rows)
        print(f"csv: {a.csv}")
    if a.plot:
        plot_svg(a.plot, rows, peers, f"cohort vs {' and '.join(PEERS[q] for q in peers)}, "
                                      f"median of {rounds} round(s)")
        print(f"plot: {a.plot}")
    if failed:
        print("compare_peers.py: some checks failed (see above)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
