"""Runs a test script under torchrun on loopback: run_torchrun.py NPROC SCRIPT [ARGS...].

Exit 77 (skipped) when Debian's torch is missing. A free port for the store, a bound on the
whole job, and the job's exit status as this script's.
"""
import os
import signal
import socket
import subprocess
import sys
import tempfile

try:
    import torch.distributed.run  # noqa: F401
except ImportError as e:
    print(f"skipped: torch is not installed ({e}); apt-get install python3-torch libtorch-dev")
    sys.exit(77)

argv = sys.argv[1:]
expect_killed = "--expect-killed" in argv
if expect_killed:
    argv.remove("--expect-killed")
nproc, script, *args = argv
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
env = dict(os.environ, COHORT_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", nproc,
       "--master_addr", "127.0.0.1", "--master_port", str(port),
       "--redirects", "1", "--tee", "1", script, *args]
if expect_killed:
    # The last rank kills itself; every other rank writes its verdict into a fresh directory.
    verdicts = tempfile.mkdtemp(prefix="cohort-kill-")
    env["COHORT_KILL_DIR"] = verdicts
    before = {n for n in os.listdir("/dev/shm") if n.startswith("cohort-torch-")}
job = subprocess.Popen(cmd, env=env, start_new_session=True)
try:
    status = job.wait(timeout=float(os.environ.get("TORCH_TEST_TIMEOUT", 240)))
    if not expect_killed:
        sys.exit(status)
    failed = False
    for r in range(int(nproc) - 1):
        path = os.path.join(verdicts, f"rank{r}")
        verdict = open(path).read() if os.path.exists(path) else "FAILED: no verdict"
        print(f"rank {r}: {verdict}")
        failed = failed or not verdict.startswith("ok")
    left = {n for n in os.listdir("/dev/shm") if n.startswith("cohort-torch-")} - before
    if left:
        print(f"FAILED: left in /dev/shm: {sorted(left)}")
    sys.exit(1 if failed or left else 0)
except subprocess.TimeoutExpired:
    os.killpg(job.pid, signal.SIGKILL)  # torchrun and every rank
    job.wait()
    print("FAILED: the job ran past its time limit")
    sys.exit(1)
