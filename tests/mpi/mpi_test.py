#!/usr/bin/env python3
"""Runs mpi_rank as P processes under Open MPI's mpirun, on this host only (shared memory:
--mca pml ob1 --mca btl self,vader), and passes when every rank exits 0.

usage: mpi_test.py P MPI_RANK ARGS...

Exit status: 0 pass, 1 fail, 77 skipped (mpirun missing).
"""

import os
import shutil
import subprocess
import sys
import time

LIMIT = 240  # seconds the whole job may take


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        return 2
    ranks, program, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        print("SKIP: mpirun is not installed (Debian: apt-get install openmpi-bin)")
        return 77
    cmd = [mpirun, "--oversubscribe", "-np", ranks, "--mca", "pml", "ob1", "--mca", "btl",
           "self,vader", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    env = dict(os.environ)
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    cmd += [program] + args
    print(" ".join(cmd), flush=True)
    start = time.monotonic()
    try:
        # A new session, so that a job past its limit is ended whole.
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        code = proc.wait(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        print(f"FAIL: the job ran past {LIMIT} s")
        return 1
    print(f"mpirun exited {code} after {time.monotonic() - start:.1f} s", flush=True)
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
