#!/usr/bin/env python3
"""The data-parallel example over TCP under Debian's torchrun (torch.distributed.run).

usage: torchrun_tcp.py TRAIN_DATA_PARALLEL

torchrun hosts its own store on MASTER_PORT, the port cohort's TCP setup would host its store on,
so the example needs a store of its own there:

  with COHORT_STORE=127.0.0.1:<a free port>  2 ranks train 3 epochs and torchrun exits 0;
  without it                                 rank 0 fails at once, saying that the port is taken by
                                             torchrun's store and to set COHORT_STORE, and
                                             torchrun exits non-zero (well before the 60 s the
                                             setup would otherwise wait).

torchrun runs under /usr/bin/python3 (Debian's python3-torch). Torch 1.13's torch.distributed.run
on Python 3.11 fails without --redirects and --tee ('NoneType' object has no attribute 'get'), and
maps only the values 1 and 2 (3 and 0 fail the same way), so both are 1: the ranks' stdout is
copied to the console, prefixed [default<rank>]:. Every run is bounded; a run past its bound is
killed with its whole process group. Exit status: 0 pass, 1 fail, 77 skipped (no torch).
"""

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

PYTHON = "/usr/bin/python3"
LIMIT = 150  # seconds one torchrun job may take (a loaded 2-core machine: about 10 s)
PROMPT = 45  # seconds the failing job may take, torchrun's start included (the setup waits 60 s)
LAUNCHER_VARS = re.compile(r"^(COHORT_|RANK$|WORLD_SIZE$|LOCAL_RANK$|LOCAL_WORLD_SIZE$|MASTER_|"
                           r"GROUP_RANK$|ROLE_|TORCHELASTIC_|OMPI_|PMI_|PMIX_|MPI_LOCAL|SLURM_)")


def skip(why):
    print(f"torchrun_tcp: skipped: {why}", file=sys.stderr)
    sys.exit(77)


def fail(why):
    print(f"torchrun_tcp: FAIL: {why}", file=sys.stderr)
    sys.exit(1)


def free_ports(n):
    """n distinct TCP ports on 127.0.0.1 that nothing listens on right now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def check_torch():
    if not os.access(PYTHON, os.X_OK):
        skip(f"{PYTHON} not found (Debian: python3-torch)")
    try:
        r = subprocess.run([PYTHON, "-c", "import torch.distributed as d, torch.distributed.run; "
                            "assert d.is_available(), 'torch.distributed is not available'"],
                           capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        skip(f"{PYTHON} took more than 120 s to import torch")
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["(no message)"])[-1]
        skip(f"{PYTHON} cannot import torch.distributed.run: {last}")


def torchrun(program, master_port, store, log_dir):
    """Runs the example with 2 ranks under torchrun; returns (exit status, output, seconds)."""
    env = {k: v for k, v in os.environ.items() if not LAUNCHER_VARS.match(k)}
    if store:
        env["COHORT_STORE"] = store
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--redirects", "1", "--tee", "1", "--log_dir", log_dir,
           "--master_addr", "127.0.0.1", "--master_port", str(master_port),
           "--no_python", program, "--transport", "tcp", "--epochs", "3"]
    print("$", ("COHORT_STORE=" + store + " ") if store else "", " ".join(cmd), flush=True)
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        print(out)
        fail(f"torchrun ran past {LIMIT} s")
    finally:
        try:  # torchrun's workers, should one outlive it
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    seconds = time.monotonic() - t0
    print(out)
    print(f"exit status {p.returncode} after {seconds:.1f} s", flush=True)
    return p.returncode, out, seconds


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    program = os.path.abspath(sys.argv[1])
    check_torch()
    master_port, store_port = free_ports(2)

    with tempfile.TemporaryDirectory(prefix="cohort-torchrun-") as logs:
        # With a store of its own: trains.
        code, out, took = torchrun(program, master_port, f"127.0.0.1:{store_port}", logs)
        if code != 0:
            fail(f"with COHORT_STORE set, torchrun exited {code}")
        for want in ("2 ranks over tcp", "epoch   3", "done: test accuracy"):
            if want not in out:
                fail(f"with COHORT_STORE set, the output does not say '{want}'")
        trained = took

        # Without: a clear error, at once. A fresh MASTER_PORT: the last one may linger.
        master_port, = free_ports(1)
        code, out, took = torchrun(program, master_port, None, logs)
        if code == 0:
            fail("without COHORT_STORE, torchrun exited 0; rank 0 cannot host its store there")
        for want in ("rank 0 cannot host the store", "torchrun's own store",
                     "COHORT_STORE=127.0.0.1:<a free port>", "COHORT_STORE=file:"):
            if want not in out:
                fail(f"without COHORT_STORE, the output does not say '{want}'")
        if took > PROMPT:
            fail(f"without COHORT_STORE, the job took {took:.1f} s to fail (at most {PROMPT} s)")

    print(f"ok: with COHORT_STORE trained in {trained:.1f} s; without it failed in {took:.1f} s "
          f"(torchrun's start included), naming torchrun's store and COHORT_STORE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
