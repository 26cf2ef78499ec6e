"""all_reduce through torch.distributed: the cohort backend against gloo in one job, float32
sum, 4 B to 64 MiB, the two interleaved round by round; medians with their spread.

    PYTHONPATH=BUILD/integrations/torch:integrations/torch OMP_NUM_THREADS=1 \\
      /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 --redirects 1 --tee 1 \\
      bench/torch/all_reduce.py [--max-mb 64] [--rounds 5]

busbw as in nccl-tests: algbw * 2(P-1)/P.
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist

import cohort_torch

ap = argparse.ArgumentParser()
ap.add_argument("--max-mb", type=float, default=64)
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--budget", type=float, default=0.05, help="seconds per size per round")
a = ap.parse_args()

dist.init_process_group("cohort")
gloo = dist.new_group(backend="gloo")
rank, P = dist.get_rank(), dist.get_world_size()
groups = {"cohort": None, "gloo": gloo}


def timed(group, t, iters):
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=group)
    return (time.perf_counter() - start) / iters


if rank == 0:
    print(f"P={P}, cohort over {cohort_torch.transport()}; median of {a.rounds} rounds "
          f"[min..max], us; busbw GB/s", flush=True)
    print(f"{'bytes':>10} {'cohort us':>26} {'gloo us':>26} {'cohort GB/s':>12} "
          f"{'gloo GB/s':>10}", flush=True)
size = 4
while size <= a.max_mb * 2**20:
    t = torch.ones(size // 4)
    # Iterations per round from one probe, the same on every rank.
    probe = torch.tensor([timed(None, t, 3)], dtype=torch.float64)
    dist.all_reduce(probe, op=dist.ReduceOp.MAX, group=gloo)
    iters = max(1, min(1000, int(a.budget / max(probe.item(), 1e-7))))
    times = {"cohort": [], "gloo": []}
    for r in range(a.rounds):
        for name in (("cohort", "gloo") if r % 2 == 0 else ("gloo", "cohort")):
            times[name].append(timed(groups[name], t, iters))
    if rank == 0:
        med = {k: statistics.median(v) for k, v in times.items()}
        cell = {k: f"{med[k] * 1e6:.1f} [{min(v) * 1e6:.1f}..{max(v) * 1e6:.1f}]"
                for k, v in times.items()}
        bus = {k: size / med[k] * 2 * (P - 1) / P / 1e9 for k in med}
        print(f"{size:>10} {cell['cohort']:>26} {cell['gloo']:>26} {bus['cohort']:>12.2f} "
              f"{bus['gloo']:>10.2f}", flush=True)
    size *= 4
dist.destroy_process_group()
