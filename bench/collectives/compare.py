#!/usr/bin/env python3
"""Compare cohort with Open MPI, collective by collective, on one host.

Runs cohort-bench and cohort-bench-mpi (the same options, measuring code and checks) in
interleaved rounds -- cohort then MPI, then MPI then cohort, ... -- so that both see the same
noise from the neighbours on a shared machine. For every rank count and size it takes the
median of the per-round p50 times and their spread (min..max over rounds), and prints a table
with the time ratio cohort/MPI, the busbw of both and the machine's memcpy ceiling. It writes
the medians as CSV and plots busbw against size (log x) as SVG or PNG with gnuplot, or with
matplotlib when gnuplot is missing.

    bench/collectives/compare.py --build build-bench --ranks 2,4 \\
        --sizes 4,1K,64K,1M,16M,64M --rounds 5 --csv out.csv --plot out.svg

The same driver serves the TCP transport, and cohort over MPI (mpi_transport, both under the
same mpirun and btl):
    compare.py --transport tcp --mpi-btl tcp ...
    compare.py --transport mpi ...

Stdlib only. Exit status 0 when every run passed its checks, 1 otherwise.
"""

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

MPI_BTL_ARGS = {
    "vader": ["--mca", "btl", "self,vader"],
    "tcp": ["--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"],
}
CONTENDERS = ("cohort", "mpi")


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--build", default="build-bench",
                   help="Meson build directory holding bench/collectives/ (default build-bench)")
    p.add_argument("--cohort", help="cohort-bench executable (default: from --build)")
    p.add_argument("--mpi", help="cohort-bench-mpi executable (default: from --build)")
    p.add_argument("--mpirun", default="mpirun", help="mpirun executable (default mpirun)")
    p.add_argument("--ranks", default="2", help="comma-separated rank counts (default 2)")
    p.add_argument("--op", default="all_reduce")
    p.add_argument("--dtype", default="f32")
    p.add_argument("--reduce", default="sum")
    p.add_argument("--sizes", default="4,1K,64K,1M,16M,64M",
                   help="comma-separated full-buffer sizes (default 4,1K,64K,1M,16M,64M)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--budget-ms", type=int, default=200, help="timed time per size and run")
    p.add_argument("--min-iters", type=int, default=10, help="fewest timed calls per size")
    p.add_argument("--max-iters", type=int, default=10000, help="most timed calls per size")
    p.add_argument("--transport", default="shm", help="cohort's transport (default shm)")
    p.add_argument("--mpi-btl", choices=sorted(MPI_BTL_ARGS), default="vader",
                   help="Open MPI's byte transfer layer (default vader: shared memory)")
    p.add_argument("--chrt", choices=("auto", "on", "off"), default="auto",
                   help="run under chrt -f 1; auto: when root and ranks <= cpus (default)")
    p.add_argument("--csv", help="write the medians here")
    p.add_argument("--raw", help="write every run's JSON document here, one per line")
    p.add_argument("--plot", help="write the busbw plot here (.svg or .png)")
    p.add_argument("--title", help="plot title")
    p.add_argument("--run-timeout", type=float, default=600, help="seconds per run")
    p.add_argument("--replay", metavar="RAW",
                   help="run nothing: summarize and plot the documents of an earlier --raw")
    p.add_argument("-n", "--dry-run", action="store_true", help="print the commands only")
    args = p.parse_args(argv)
    args.ranks = [int(r) for r in args.ranks.split(",")]
    if args.rounds < 1 or any(r < 1 for r in args.ranks):
        p.error("--rounds and --ranks must be positive")
    exe_dir = os.path.join(args.build, "bench", "collectives")
    args.cohort = args.cohort or os.path.join(exe_dir, "cohort-bench")
    args.mpi = args.mpi or os.path.join(exe_dir, "cohort-bench-mpi")
    return args


def chrt_prefix(args, ranks):
    """["chrt", "-f", "1"] when asked for (or, with auto, when it is safe and allowed)."""
    if args.chrt == "off" or shutil.which("chrt") is None:
        return []
    if args.chrt == "auto":
        spinning_fits = ranks <= (os.cpu_count() or 1)  # FIFO spinners must not starve peers
        if os.geteuid() != 0 or not spinning_fits:
            return []
        if subprocess.run(["chrt", "-f", "1", "true"], capture_output=True).returncode != 0:
            return []
    return ["chrt", "-f", "1"]


def commands(args, ranks):
    """The command line of each contender at `ranks` ranks."""
    common = ["--op", args.op, "--dtype", args.dtype, "--reduce", args.reduce,
              "--sizes", args.sizes, "--warmup", str(args.warmup),
              "--budget-ms", str(args.budget_ms), "--min-iters", str(args.min_iters),
              "--max-iters", str(args.max_iters), "--format", "json", "--check"]
    prefix = chrt_prefix(args, ranks)
    mpirun = [args.mpirun]
    if os.geteuid() == 0:
        mpirun.append("--allow-run-as-root")
    mpirun += ["--oversubscribe", "-np", str(ranks), "--mca", "pml", "ob1"]
    mpirun += MPI_BTL_ARGS[args.mpi_btl]
    cohort = [args.cohort, "--ranks", str(ranks), "--transport", args.transport] + common
    if args.transport == "mpi":  # cohort over mpi_transport runs under the same mpirun
        cohort = mpirun + cohort
    return {"cohort": prefix + cohort, "mpi": prefix + mpirun + [args.mpi] + common}


def rank0_output(stdout):
    """`stdout` without cohort-run's "[rank] " prefixes: rank 0's lines only (as is when the
    ranks were not started by cohort-run)."""
    if not stdout.startswith("[0] "):
        return stdout
    return "".join(line[4:] for line in stdout.splitlines(True) if line.startswith("[0] "))


def run_once(cmd, timeout):
    """Runs one benchmark; returns its JSON document. Exits on a failure other than a check."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        sys.exit(f"compare.py: timed out after {timeout} s: {' '.join(cmd)}")
    try:
        doc = json.loads(rank0_output(proc.stdout))
    except json.JSONDecodeError:
        sys.exit(f"compare.py: exit status {proc.returncode} and no JSON from:\n  "
                 f"{' '.join(cmd)}\n{proc.stderr.strip()}")
    if proc.returncode != 0:
        print(f"compare.py: check failed (status {proc.returncode}): {' '.join(cmd)}\n"
              f"{proc.stderr.strip()}", file=sys.stderr)
    return doc


def replay(args):
    """The documents of an earlier run's --raw file, as `collect` returns them. The rank
    counts and the rounds come from the file."""
    docs, failed = {}, False
    with open(args.replay) as f:
        for line in f:
            rec = json.loads(line)
            docs.setdefault((rec["ranks"], rec["contender"]), []).append(rec["result"])
            failed |= any(r["wrong"] not in (0, None) for r in rec["result"]["results"])
    args.ranks = sorted({p for p, _ in docs})
    args.rounds = max(len(v) for v in docs.values())
    first = next(iter(docs.values()))[0]
    args.op, args.dtype = first["collective"], first["dtype"]
    args.reduce = first["reduce"] or args.reduce
    return docs, failed


def machine_ceiling(runs):
    """The memcpy ceiling of a set of runs: the best of their bests. Each run's figure is
    already the best of its copies; neighbours on a shared machine only ever lower it."""
    return max(d["memcpy"]["GBps"] for d in runs)


def spread(values):
    """(median, min, max) of `values`."""
    return statistics.median(values), min(values), max(values)


def collect(args, raw):
    """Runs the rounds (logging each document to `raw` when given); returns
    ({(ranks, who): [doc, ...]}, failed)."""
    docs = {(p, who): [] for p in args.ranks for who in CONTENDERS}
    failed = False
    for rnd in range(args.rounds):
        for p in args.ranks:
            cmds = commands(args, p)
            order = CONTENDERS if rnd % 2 == 0 else CONTENDERS[::-1]
            for who in order:
                if args.dry_run:
                    if rnd == 0:
                        print(" ".join(cmds[who]))
                    continue
                print(f"round {rnd + 1}/{args.rounds}, P={p}: {who}", file=sys.stderr)
                doc = run_once(cmds[who], args.run_timeout)
                if raw:
                    raw.write(json.dumps({"round": rnd + 1, "ranks": p, "contender": who,
                                          "command": cmds[who], "result": doc}) + "\n")
                failed |= any(r["wrong"] not in (0, None) for r in doc["results"])
                docs[(p, who)].append(doc)
    return docs, failed


def summarize(args, docs):
    """One row per (ranks, bytes, contender) with medians and spreads over the rounds."""
    rows = []
    for (p, who), runs in docs.items():
        by_size = {}
        for doc in runs:
            for r in doc["results"]:
                by_size.setdefault(r["bytes"], []).append(r)
        ceiling = machine_ceiling(runs)
        for nbytes, rs in sorted(by_size.items()):
            p50 = spread([r["p50_us"] for r in rs])
            busbw = spread([r["busbw_GBps"] for r in rs])
            rows.append({
                "ranks": p, "bytes": nbytes, "contender": who, "rounds": len(rs),
                "p50_us_median": p50[0], "p50_us_min": p50[1], "p50_us_max": p50[2],
                "p99_us_median": statistics.median(r["p99_us"] for r in rs),
                "busbw_GBps_median": busbw[0], "busbw_GBps_min": busbw[1],
                "busbw_GBps_max": busbw[2],
                "wrong": max((r["wrong"] or 0) for r in rs),
                "memcpy_GBps": ceiling,
                "transport": runs[0]["transport"],
            })
    return rows


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}"
        n /= 1024


def human_us(us):
    if us < 10:
        return f"{us:.2f}"
    if us < 1000:
        return f"{us:.1f}"
    return f"{us:.0f}"


def print_table(args, rows, docs):
    """A Markdown table per rank count: medians, spreads, the ratio and both busbw."""
    index = {(r["ranks"], r["bytes"], r["contender"]): r for r in rows}
    ceilings = [d["memcpy"] for runs in docs.values() for d in runs]
    c_bytes = ceilings[0]["bytes"]
    c_med, c_min, c_max = spread([c["GBps"] for c in ceilings])
    what = f"{args.op} {args.dtype}"
    if args.op in ("all_reduce", "reduce_scatter"):
        what += f" {args.reduce}"
    host = next(iter(docs.values()))[0]["host"]
    print(f"\n{what}: {contender_name('cohort', docs)} vs {contender_name('mpi', docs)}, "
          f"{args.rounds} interleaved rounds; host: {host}")
    print(f"memcpy ceiling (one thread, {human_bytes(c_bytes)}): {c_max:.2f} GB/s, the best of "
          f"{len(ceilings)} runs (median {c_med:.2f}, worst {c_min:.2f})")
    for p in args.ranks:
        print(f"\nP = {p}: p50 time per call in us, median over rounds [min-max]; "
              "busbw in GB/s (median)\n")
        print("| size | cohort p50 | MPI p50 | cohort/MPI | cohort busbw | MPI busbw |")
        print("|---:|---:|---:|---:|---:|---:|")
        for nbytes in sorted({r["bytes"] for r in rows if r["ranks"] == p}):
            c, m = index.get((p, nbytes, "cohort")), index.get((p, nbytes, "mpi"))
            if c is None or m is None:
                continue
            cell = lambda r: (f"{human_us(r['p50_us_median'])} "
                              f"[{human_us(r['p50_us_min'])}-{human_us(r['p50_us_max'])}]")
            ratio = c["p50_us_median"] / m["p50_us_median"] if m["p50_us_median"] else float("nan")
            print(f"| {human_bytes(nbytes)} | {cell(c)} | {cell(m)} | {ratio:.2f} | "
                  f"{c['busbw_GBps_median']:.2f} | {m['busbw_GBps_median']:.2f} |")


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)


def series(rows, p, who):
    pts = sorted((r for r in rows if r["ranks"] == p and r["contender"] == who),
                 key=lambda r: r["bytes"])
    return [(r["bytes"], r["busbw_GBps_median"], r["busbw_GBps_min"], r["busbw_GBps_max"])
            for r in pts]


def contender_name(who, docs):
    """"cohort (shm)", "Open MPI (self,vader)": the name and the transport the runs report."""
    doc = next(v[0] for (_, w), v in docs.items() if w == who and v)
    if who == "cohort":
        return f"cohort ({doc['transport']})"
    btl = [w[4:] for w in doc["transport"].split() if w.startswith("btl=")]
    return f"Open MPI ({btl[0] if btl else doc['transport']})"


def label(who, p, docs):
    return f"{contender_name(who, docs)}, P={p}"


def gnuplot_string(text):
    """`text` as a single-quoted gnuplot string."""
    return "'" + text.replace("'", "''") + "'"


def plot_gnuplot(path, rows, args, docs, title, ceiling):
    term = "pngcairo size 900,540" if path.endswith(".png") else \
        "svg size 900,540 dynamic font 'sans,12'"
    sizes = sorted({r["bytes"] for r in rows})
    xtics = ", ".join(f'"{human_bytes(b)}" {b}' for b in sizes)
    top = 1.1 * max([ceiling] + [r["busbw_GBps_max"] for r in rows])
    lines = [f"set terminal {term}", "set termoption noenhanced",
             f"set output {gnuplot_string(path)}", f"set title {gnuplot_string(title)}",
             "set logscale x 2", f"set xtics ({xtics})",
             f"set xrange [{sizes[0] / 1.5}:{sizes[-1] * 1.5}]",
             "set xlabel 'size (full buffer)'",
             "set ylabel 'busbw (GB/s): median, bars min-max over rounds'",
             "set key at graph 0.02, graph 0.86 left top", "set grid ytics",
             f"set yrange [0:{top}]",
             f"set arrow from graph 0, first {ceiling} to graph 1, first {ceiling} nohead dt 3",
             f"set label 'memcpy ceiling, one thread: {ceiling:.1f} GB/s' at graph 0.02, first "
             f"{ceiling} offset 0,0.6"]
    plots, blocks = [], []
    for i, p in enumerate(args.ranks):
        for who in CONTENDERS:
            name = f"$d_{who}_{p}"
            blocks.append(f"{name} << EOD")
            blocks += [f"{x} {y} {lo} {hi}" for x, y, lo, hi in series(rows, p, who)]
            blocks.append("EOD")
            dash = 1 if who == "cohort" else 2
            color = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"][
                (2 * i + (who == "mpi")) % 6]
            plots.append(f"{name} using 1:2:3:4 with yerrorlines dt {dash} lw 2 pt 7 ps 0.6 "
                         f"lc rgb '{color}' title {gnuplot_string(label(who, p, docs))}")
    script = "\n".join(blocks + lines) + "\nplot " + ", \\\n  ".join(plots) + "\n"
    with tempfile.NamedTemporaryFile("w", suffix=".gp", delete=False) as f:
        f.write(script)
    try:
        subprocess.run(["gnuplot", f.name], check=True)
    finally:
        os.unlink(f.name)


def plot_matplotlib(path, rows, args, docs, title, ceiling):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5.4))
    for p in args.ranks:
        for who in CONTENDERS:
            s = series(rows, p, who)
            x, y = [t[0] for t in s], [t[1] for t in s]
            err = [[t[1] - t[2] for t in s], [t[3] - t[1] for t in s]]
            ax.errorbar(x, y, yerr=err, marker="o", ms=3, capsize=2,
                        ls="-" if who == "cohort" else "--", label=label(who, p, docs))
    ax.axhline(ceiling, ls=":", color="gray",
               label=f"memcpy ceiling, one thread: {ceiling:.1f} GB/s")
    ax.set_xscale("log", base=2)
    sizes = sorted({r["bytes"] for r in rows})
    ax.set_xticks(sizes, [human_bytes(b) for b in sizes])
    top = 1.1 * max([ceiling] + [r["busbw_GBps_max"] for r in rows])
    ax.set(title=title, xlabel="size (full buffer)", ylabel="busbw (GB/s)", ylim=(0, top))
    ax.grid(axis="y")
    ax.legend(loc="upper left")
    fig.savefig(path, bbox_inches="tight")


def plot(path, rows, args, docs):
    ceiling = machine_ceiling([d for runs in docs.values() for d in runs])
    title = args.title or (f"{args.op} {args.dtype}, cohort vs Open MPI, "
                           f"median of {args.rounds} interleaved rounds")
    if shutil.which("gnuplot"):
        plot_gnuplot(path, rows, args, docs, title, ceiling)
    else:
        try:
            plot_matplotlib(path, rows, args, docs, title, ceiling)
        except ImportError:
            print("compare.py: neither gnuplot nor matplotlib found; no plot", file=sys.stderr)
            return
    print(f"\nplot: {path}")


def main(argv):
    args = parse_args(argv)
    if not args.dry_run and not args.replay:
        for exe in (args.cohort, args.mpi):
            if not os.access(exe, os.X_OK):
                sys.exit(f"compare.py: {exe} is not an executable (see --build)")
        for p in args.ranks:
            print("commands:", *(" ".join(c) for c in commands(args, p).values()),
                  sep="\n  ", file=sys.stderr)
    if args.replay:
        docs, failed = replay(args)
    else:
        raw = open(args.raw, "w") if args.raw and not args.dry_run else None
        try:
            docs, failed = collect(args, raw)
        finally:
            if raw:
                raw.close()
    if args.dry_run:
        return 0
    rows = summarize(args, docs)
    print_table(args, rows, docs)
    if args.csv:
        write_csv(args.csv, rows)
        print(f"\ncsv: {args.csv}")
    if args.plot:
        plot(args.plot, rows, args, docs)
    if failed:
        print("compare.py: some checks failed (see above)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
