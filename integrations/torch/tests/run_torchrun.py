"""Runs a test script under torchrun on loopback: run_torchrun.py NPROC SCRIPT [ARGS...].

Exit 77 (skipped) when Debian's torch is missing. A free port for the store, a bound on the
whole job, and the job's exit status as this script's.
"""
import os
import signal
import socket
import subprocess
import sys

try:
    import torch.distributed.run  # noqa: F401
except ImportError as e:
    print(f"skipped: torch is not installed ({e}); apt-get install python3-torch libtorch-dev")
    sys.exit(77)

nproc, script, *args = sys.argv[1:]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
env = dict(os.environ, COHORT_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", nproc,
       "--master_addr", "127.0.0.1", "--master_port", str(port),
       "--redirects", "1", "--tee", "1", script, *args]
job = subprocess.Popen(cmd, env=env, start_new_session=True)
try:
    sys.exit(job.wait(timeout=float(os.environ.get("TORCH_TEST_TIMEOUT", 240))))
except subprocess.TimeoutExpired:
    os.killpg(job.pid, signal.SIGKILL)  # torchrun and every rank
    job.wait()
    print("FAILED: the job ran past its time limit")
    sys.exit(1)
