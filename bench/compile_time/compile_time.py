#!/usr/bin/env python3
"""What including cohort costs the compiler: wall time, CPU time and peak memory per TU.

Compiles the probe TUs beside this script (each includes a different set of cohort headers and
calls one all_reduce) at -O0 and -O2, N times each, and prints a Markdown table of the medians:

  (a)     cohort.hpp (loopback)                       a_loopback.cpp
  (b)     (a) + transport/shm.hpp                     b_shm.cpp
  (c)     (a) + transport/tcp.hpp, header-only        c_tcp.cpp
  (c sep) the same TU with COHORT_SEPARATE_COMPILATION c_tcp.cpp -DCOHORT_SEPARATE_COMPILATION
  (c src) the one TU holding the TCP setup            c_tcp_src.cpp (includes cohort/impl/src.hpp)
  (d)     (a) + async.hpp (Asio)                      d_async.cpp

and the same calls in a translation unit that only calls all_reduce on a communicator made
elsewhere, which is what every other TU of a program pays (the setup is compiled where it is
called, once per program):

  (a call)     cohort.hpp, all_reduce on a loopback_communicator&      a_call.cpp
  (b call)     (a call) + transport/shm.hpp, on a shm_communicator&    b_shm_call.cpp
  (c call)     (a call) + transport/tcp.hpp, on a tcp_communicator&    c_tcp_call.cpp
  (c call sep) the same TU with COHORT_SEPARATE_COMPILATION            c_tcp_call.cpp -D...

CPU seconds are user + system of the compiler and everything it runs (cc1plus, as), taken
from getrusage(RUSAGE_CHILDREN); peak memory is the largest resident set among them. The
machine is shared: CPU time is the steadier figure, and the median of N runs is reported.

Usage: compile_time.py [COMPILER] [--runs 5] [--best] [--include DIR] [--baseline DIR]
                       [--opt 0 2] [--only a,b]
"""
import argparse
import os
import pathlib
import re
import resource
import shlex
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent

# name, description, source, extra flags
PROBES = [
    ("a", "cohort.hpp + all_reduce (loopback)", "a_loopback.cpp", []),
    ("b", "(a) + transport/shm.hpp", "b_shm.cpp", []),
    ("c", "(a) + transport/tcp.hpp, header-only", "c_tcp.cpp", []),
    ("c sep", "(a) + transport/tcp.hpp, COHORT_SEPARATE_COMPILATION", "c_tcp.cpp",
     ["-DCOHORT_SEPARATE_COMPILATION"]),
    ("c src", "the one TU with cohort/impl/src.hpp", "c_tcp_src.cpp",
     ["-DCOHORT_SEPARATE_COMPILATION"]),
    ("d", "(a) + async.hpp (Asio)", "d_async.cpp", []),
    ("a call", "cohort.hpp, only the all_reduce call", "a_call.cpp", []),
    ("b call", "+ transport/shm.hpp, only the all_reduce call", "b_shm_call.cpp", []),
    ("c call", "+ transport/tcp.hpp, only the all_reduce call, header-only", "c_tcp_call.cpp", []),
    ("c call sep", "the same, COHORT_SEPARATE_COMPILATION", "c_tcp_call.cpp",
     ["-DCOHORT_SEPARATE_COMPILATION"]),
]


def compile_once(cmd):
    """Runs `cmd` once; returns (wall s, CPU s, peak MB) of it and its children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.stderr.write("compile failed: " + shlex.join(cmd) + "\n" + proc.stdout[-4000:] + "\n")
        return None
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # ru_maxrss of RUSAGE_CHILDREN is the largest of all children so far (KiB on Linux): each
    # measurement runs in a fresh interpreter (see measure) so that it is this run's.
    return wall, cpu, after.ru_maxrss / 1024.0


def measure(cmd):
    """One compile in a child interpreter, so that its peak memory is not an earlier one's."""
    child = [sys.executable, __file__, "--one", "--"] + cmd
    out = subprocess.run(child, stdout=subprocess.PIPE, text=True, check=True).stdout.split()
    return tuple(float(x) for x in out[-3:]) if out[-1:] != ["failed"] else None


def header_count(cmd):
    """How many headers the TU parses, and how many of them are Boost's (from -H)."""
    proc = subprocess.run(cmd + ["-E", "-H", "-o", os.devnull], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    paths = set()
    for line in proc.stderr.splitlines():
        m = re.match(r"^\.+ (\S+)$", line)
        if m:
            paths.add(os.path.normpath(m.group(1)))
    return len(paths), sum(1 for p in paths if "/boost/" in p)


def compiler_version(cxx):
    out = subprocess.run([cxx, "--version"], stdout=subprocess.PIPE, text=True).stdout
    return out.splitlines()[0] if out else cxx


def main():
    if sys.argv[1:2] == ["--one"]:  # a child of `measure`
        r = compile_once(sys.argv[3:])
        print("%.3f %.3f %.1f" % r if r else "failed")
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("compiler_pos", nargs="?", help="the compiler (same as --compiler)")
    ap.add_argument("--compiler", default=None, help="C++ compiler to measure (default g++)")
    ap.add_argument("--runs", type=int, default=5, help="compiles per cell; the median is shown")
    ap.add_argument("--include", default=str(ROOT / "include"), help="cohort's include directory")
    ap.add_argument("--opt", nargs="+", default=["0", "2"], help="optimization levels")
    ap.add_argument("--only", default="", help="comma-separated probe names (a,b,c,c sep,...)")
    ap.add_argument("--flags", default="", help="extra compiler flags")
    ap.add_argument("--best", action="store_true",
                    help="show the best (least) of the runs instead of the median: on a shared "
                         "machine the neighbours only ever add time")
    ap.add_argument("--baseline", default="",
                    help="another include directory (e.g. of an older checkout) to compare with")
    args = ap.parse_args()
    cxx = args.compiler or args.compiler_pos or "g++"
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    probes = [p for p in PROBES if not only or p[0] in only]

    pick = min if args.best else statistics.median
    trees = [args.include] + ([args.baseline] if args.baseline else [])
    print("Compiler: `%s`; %s of %d runs; flags `-std=c++20 -O<n> -c`%s." %
          (compiler_version(cxx), "best" if args.best else "median", args.runs,
           (" " + args.flags) if args.flags else ""))
    if args.baseline:
        print("Cells read `before -> after`: the tree at %s, then this one; their runs "
              "alternate, so both see the same neighbours." % args.baseline)
    print("Command: `%s`" % shlex.join(["bench/compile_time/compile_time.py"] + sys.argv[1:]))
    print()
    cols = []
    for o in args.opt:
        cols += ["-O%s wall s" % o, "-O%s CPU s" % o, "-O%s peak MB" % o]
    print("| TU | headers (Boost) | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))

    def both(values):  # one figure per tree, baseline first
        return " -> ".join(reversed(values)) if args.baseline else values[0]

    for name, desc, src, extra in probes:
        bases = [[cxx, "-std=c++20", "-I", t] + shlex.split(args.flags) + extra for t in trees]
        counts = ["%d (%d)" % header_count(b + [str(HERE / src)]) for b in bases]
        cells = []
        for o in args.opt:
            cmds = [b + ["-O" + o, "-c", str(HERE / src), "-o", os.devnull] for b in bases]
            runs = [[] for _ in cmds]
            for _ in range(args.runs):
                for i, cmd in enumerate(cmds):
                    runs[i].append(measure(cmd))
            fig = [[], [], []]
            for r in runs:
                ok = None not in r  # n/a: e.g. a tree without COHORT_SEPARATE_COMPILATION
                fig[0].append("%.2f" % pick(x[0] for x in r) if ok else "n/a")
                fig[1].append("%.2f" % pick(x[1] for x in r) if ok else "n/a")
                fig[2].append("%.0f" % pick(x[2] for x in r) if ok else "n/a")
            cells += [both(f) for f in fig]
        print("| (%s) %s | %s | %s |" % (name, desc, both(counts), " | ".join(cells)), flush=True)

if __name__ == "__main__":
    main()
