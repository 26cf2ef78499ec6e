"""A rank killed mid-training: every other rank raises RuntimeError naming the lost rank within
the timeout, and the job leaves nothing in /dev/shm. Each survivor writes its verdict to
$COHORT_KILL_DIR/rank<r> (torchrun stops the job once it sees the dead rank, so the verdicts,
not the exit status, say whether the test passed; run_torchrun.py --expect-killed reads them)."""
import datetime
import faulthandler
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import cohort_torch  # noqa: F401

faulthandler.dump_traceback_later(100, exit=True)
TIMEOUT = 20
dist.init_process_group("cohort", timeout=datetime.timedelta(seconds=TIMEOUT))
rank, P = dist.get_rank(), dist.get_world_size()
victim = P - 1
out = os.path.join(os.environ["COHORT_KILL_DIR"], f"rank{rank}")
torch.manual_seed(0)
m = DDP(nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 4)))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x, y = torch.randn(64, 32), torch.randint(0, 4, (64,))
start = None
try:
    for step in range(1000):
        if step == 5:
            start = time.monotonic()
            if rank == victim:
                os.kill(os.getpid(), signal.SIGKILL)
        loss = nn.functional.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    verdict = "FAILED: training went on without the killed rank"
except RuntimeError as e:
    took = time.monotonic() - (start or time.monotonic())
    named = f"rank {victim}" in str(e)
    ok = named and took < TIMEOUT
    verdict = (f"{'ok' if ok else 'FAILED'}: RuntimeError after {took:.2f} s "
               f"({'names' if named else 'does not name'} rank {victim}): {e}")
print(f"rank {rank}: {verdict}", flush=True)
with open(out, "w") as f:
    f.write(verdict)
os._exit(0)
