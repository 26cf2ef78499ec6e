#!/usr/bin/env python3
"""A bounded libFuzzer run of every target, as one test.

usage: run_fuzzers.py --skip REASON
       run_fuzzers.py --seconds S --artifacts DIR NAME:FUZZER:CORPUS[:MAX_LEN]...

Each fuzzer runs S seconds from the committed corpus (read-only: new inputs go to a temporary
directory), with -error_exitcode=1 (libFuzzer's default is 77, which meson reads as a skip).
A crash leaves its input in DIR and fails the test: minimise it (FUZZER -minimize_crash=1
-runs=10000 INPUT), add it to tests/fuzz/corpus/NAME/ once fixed, or to
tests/fuzz/known_bugs/NAME/ while it is not. Exit: 0 pass, 1 fail, 77 skipped.
"""

import os
import re
import subprocess
import sys
import tempfile
import time


def main(argv):
    if len(argv) >= 2 and argv[0] == "--skip":
        print(f"SKIP: {' '.join(argv[1:])}", file=sys.stderr)
        return 77
    seconds, artifacts, targets = 20, None, []
    i = 0
    while i < len(argv):
        if argv[i] == "--seconds":
            seconds = int(argv[i + 1])
            i += 2
        elif argv[i] == "--artifacts":
            artifacts = argv[i + 1]
            i += 2
        else:
            targets.append(argv[i].split(":"))
            i += 1
    os.makedirs(artifacts, exist_ok=True)
    total_runs, failed = 0, []
    for t in targets:
        name, fuzzer, corpus = t[0], t[1], t[2]
        max_len = t[3] if len(t) > 3 else "4096"
        with tempfile.TemporaryDirectory(prefix=f"cohort-fuzz-{name}-") as fresh:
            cmd = [fuzzer, "-error_exitcode=1", "-timeout=25", "-rss_limit_mb=2560",
                   f"-max_total_time={seconds}", f"-max_len={max_len}", "-print_final_stats=1",
                   f"-artifact_prefix={os.path.join(artifacts, name)}-", fresh, corpus]
            start = time.monotonic()
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
            took = time.monotonic() - start
        runs = re.search(r"stat::number_of_executed_units:\s*(\d+)", p.stderr)
        cov = re.findall(r"cov: (\d+)", p.stderr)
        runs = int(runs.group(1)) if runs else 0
        total_runs += runs
        print(f"{name}: {runs} executions in {took:.0f} s, coverage {cov[-1] if cov else '?'} edges, "
              f"exit {p.returncode}")
        if p.returncode != 0:
            failed.append(name)
            print(p.stderr[-6000:])
    print(f"fuzzing: {total_runs} executions over {len(targets)} targets; "
          f"{'crashes in ' + ', '.join(failed) if failed else 'no crash'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
