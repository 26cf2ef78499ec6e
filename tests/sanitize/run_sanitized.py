#!/usr/bin/env python3
"""Builds this tree under a sanitizer and runs its test suite there.

    run_sanitized.py --sanitize address,undefined|thread --source SRC --build DIR
                     [--scale 0.25] [--suppressions tsan.supp] -- CXX...

Configures DIR (once) with the compiler given after --, builds it, and runs every test except
those that only compile or package, need a GPU, run the MPI peer, or run libFuzzer. A report
from any sanitizer ends its process with an error, so the test that ran it fails. Prints the
build and test times and the counts; exits with meson test's status.
"""
import argparse
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import time

# Left out of the sanitized run: the benchmarks' smoke runs (the soak, in the faults suite,
# covers the same calls and checks them), the CUDA tests, the libFuzzer run, which builds its
# own sanitized binaries, the whole-matrix twins of thinned tests (suite 'full': the thinned
# ones run instead), and the tests that run inside Open MPI or libtorch, which are not built
# with the sanitizers (their own allocations would be reported, and ASan's runtime cannot be
# loaded into an uninstrumented Python), and the parameter server's accuracy check, five
# trainings to 40 epochs whose calls `ps processes` and `ps threads` make here too (under TSan
# they took 265 s of the test's 360 on a quiet machine, past them on a busy one). Tests that
# only compile or package are not even configured.
EXCLUDED_SUITES = ("bench", "cuda", "full", "mpi", "torch")
EXCLUDED_TESTS = ("fuzz run", "ps accuracy")
# Under TSan, the collective suite's slices by element type run for one type of each size over
# loopback (float, double, fp16; int and bf16 take the same byte paths as float and fp16: the
# schedules move bytes, and only the reduction's arithmetic differs) and for float over shared
# memory, whose ranks are processes of one thread each: TSan sees the threads of one process,
# not another process writing the segment. ASan and UBSan, which check the arithmetic and the
# per-type sizes, run every slice. Left out, they were about 560 of the 2350 test-seconds of the
# TSan run in CI, which is the slow tier's longest test.
TSAN_EXCLUDED_TESTS = ("collectives-loopback int", "collectives-loopback bf16",
                       "shm suite double", "shm suite int", "shm suite fp16", "shm suite bf16")


# Where a failed test's output says what went wrong: a sanitizer's report, a doctest failure,
# an exception or an assertion.
FIRST_WORDS = re.compile(r"WARNING: ThreadSanitizer|ERROR: \w+Sanitizer|runtime error:|"
                         r"ERROR: |FATAL ERROR|terminate called|Assertion .* failed|Traceback")


def excerpt(stdout, stderr, lines=25):
    """The part of a failed test's output worth reading first: of its standard output and of its
    standard error (where the sanitizers report; meson keeps the two apart), each from the first
    line that says what went wrong, else its end. CI shows only the end of the whole run's
    output, so the failures are printed again after the counts of the nested run."""
    chosen = []
    for name, stream in (("output", stdout), ("error", stderr)):
        text = stream.splitlines()
        first = next((i for i, line in enumerate(text) if FIRST_WORDS.search(line)), None)
        part = text[first:first + lines] if first is not None else text[-lines:]
        if part:
            chosen += [f"(standard {name})"] + part
    return "\n".join("    | " + line[:200] for line in chosen)


def run(cmd, env=None, cwd=None):
    print("+", " ".join(shlex.quote(str(c)) for c in cmd), flush=True)
    return subprocess.run(cmd, env=env, cwd=cwd).returncode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sanitize", required=True, choices=["address,undefined", "thread"])
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--scale", default="0.25")
    ap.add_argument("--suppressions")
    ap.add_argument("cxx", nargs="+")
    a = ap.parse_args()

    build = pathlib.Path(a.build)
    env = dict(os.environ)
    env["CXX"] = " ".join(shlex.quote(c) for c in a.cxx)
    # -Og -g1: line numbers in every report; -Og after every program's own level (-O0 for
    # those that move little data in the fast tier, tests/meson.build), as -O0 saves little
    # here (tests/faults/process.cpp under ASan+UBSan: 36 s against 42 s) and runs 1.6 to 4
    # times slower under the sanitizers. -Og compiles in about half the time of -O1 under
    # ASan+UBSan (104 s -> 53 s for tests/collectives/loopback.cpp, 135 s -> 77 s for
    # tests/faults/soak.cpp) and in 0.6 of it under TSan, and its programs take 1.0 to 1.3 times
    # -O1's time. Assertions on (-Db_ndebug=false: the project's b_ndebug=if-release defines
    # NDEBUG under buildtype plain).
    flags = "-Og -g1 -fno-sanitize-recover=all -fno-omit-frame-pointer"
    t0 = time.monotonic()
    if not (build / "build.ninja").exists():
        # Configure from inside the build directory: meson's CMake probe runs
        # `cmake --system-information`, which makes and removes a scratch directory in the
        # working directory, and the two sanitizer runs start side by side in the same one.
        build.mkdir(parents=True, exist_ok=True)
        rc = run(["meson", "setup", str(build), a.source, "--buildtype=plain",
                  "-Db_ndebug=false",
                  "-Db_sanitize=" + a.sanitize, "-Db_lundef=false", "-Dcuda=disabled",
                  "-Dcompile_checks=false", "-Dsanitizer_runs=disabled",
                  "-Dcpp_args=" + flags, "-Dcpp_link_args=" + flags], env, cwd=build)
        if rc:
            return rc
    info = build / "meson-info"
    tests = json.loads((info / "intro-tests.json").read_text())
    excluded = EXCLUDED_TESTS + (TSAN_EXCLUDED_TESTS if a.sanitize == "thread" else ())
    chosen = [t for t in tests
              if not set(t["suite"]) & {f"cohort:{x}" for x in EXCLUDED_SUITES}
              and t["name"] not in excluded]
    left_out = sorted(t["name"] for t in tests if t not in chosen)
    # Build only what the chosen tests run: their programs, the built files among their
    # arguments, and the targets they declare they depend on.
    outputs = {}
    for target in json.loads((info / "intro-targets.json").read_text()):
        for f in target["filename"]:
            outputs[f] = target["id"]
    ids = {target_id for t in chosen for target_id in t.get("depends", [])}
    ids |= {outputs[c] for t in chosen for c in t["cmd"] if c in outputs}
    wanted = sorted({os.path.relpath(f, build) for f, i in outputs.items() if i in ids})
    rc = run(["ninja", "-C", str(build)] + wanted, env)
    if rc:
        return rc
    t_build = time.monotonic() - t0
    print(f"{len(chosen)} tests under -fsanitize={a.sanitize}; left out: {', '.join(left_out)}",
          flush=True)

    env["COHORT_TEST_SCALE"] = a.scale
    common = "halt_on_error=1:abort_on_error=0:print_stacktrace=1"
    env["ASAN_OPTIONS"] = common + ":detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=0"
    env["UBSAN_OPTIONS"] = common
    env["LSAN_OPTIONS"] = "print_suppressions=0"
    tsan = common + ":second_deadlock_stack=1"
    if a.suppressions:
        tsan += ":suppressions=" + str(pathlib.Path(a.suppressions).resolve())
    env["TSAN_OPTIONS"] = tsan
    t1 = time.monotonic()
    # Both tiers (--setup full): the default setup would leave the slow tier's tests out.
    rc = run(["meson", "test", "-C", str(build), "--setup", "full", "--no-rebuild",
              "--print-errorlogs", "--timeout-multiplier", "3"] + [t["name"] for t in chosen], env)
    t_test = time.monotonic() - t1

    counts = {}
    failed = []
    log = build / "meson-logs" / "testlog-full.json"
    for line in log.read_text().splitlines() if log.exists() else []:
        r = json.loads(line)
        counts[r["result"]] = counts.get(r["result"], 0) + 1
        if r["result"] not in ("OK", "SKIP", "EXPECTEDFAIL"):
            failed.append(r)
    for r in failed:
        print(f"failed under -fsanitize={a.sanitize}: {r['name']} ({r['result']}, "
              f"{r['duration']:.1f} s)\n{excerpt(r.get('stdout') or '', r.get('stderr') or '')}",
              flush=True)
    print(f"-fsanitize={a.sanitize}: build {t_build:.0f} s, tests {t_test:.0f} s; "
          + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
