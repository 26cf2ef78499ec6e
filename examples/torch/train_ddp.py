"""Data-parallel training of an MLP on the UCI digits with torch DDP, on the cohort backend or
on gloo, printing one line per epoch.

    torchrun --nproc_per_node 2 --redirects 1 --tee 1 examples/torch/train_ddp.py --backend cohort
    (with PYTHONPATH holding the built _cohort_torch module and integrations/torch)

Each rank trains on its own shard of the 1437 training digits (360 are held out); the
learning rate scales with the number of ranks. --hook fp16|bf16|int8|topk:RATIO compresses the
gradients through cohort's codecs (cohort backend only).
"""
import argparse
import csv
import gzip
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = os.environ.get("COHORT_DIGITS",
                              os.path.join(HERE, "..", "..", "data", "digits", "digits.csv.gz"))


def load(path):
    with gzip.open(path, "rt") as f:
        rows = [list(map(int, r)) for r in csv.reader(f) if r]
    t = torch.tensor(rows, dtype=torch.float32)
    return t[:, :64] / 16.0, t[:, 64].long()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["cohort", "gloo"], default="cohort")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    ap.add_argument("--hook", default="none", help="none, fp16, bf16, int8 or topk:RATIO")
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--min-accuracy", type=float, default=0,
                    help="exit 1 when the final test accuracy (%%) is below this")
    a = ap.parse_args()
    if a.backend == "cohort":
        import cohort_torch  # registers the backend
    dist.init_process_group(a.backend)
    rank, P = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)

    x, y = load(a.data)
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(x), generator=g)
    test, train = order[:360], order[360:]
    shard = train[rank::P]

    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts them)
    model = DDP(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)))
    if a.hook != "none":
        if a.backend != "cohort":
            raise SystemExit("--hook needs --backend cohort")
        h = cohort_torch.hooks
        hook = (h.top_k(float(a.hook.split(":")[1])) if a.hook.startswith("topk:")
                else getattr(h, a.hook))
        model.register_comm_hook(None, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05 * P, momentum=0.9)
    start = time.perf_counter()
    if rank == 0:
        extra = f", transport {cohort_torch.transport()}" if a.backend == "cohort" else ""
        print(f"{P} ranks on {a.backend}{extra}, hook {a.hook}", flush=True)
    for epoch in range(1, a.epochs + 1):
        t0 = time.perf_counter()
        perm = shard[torch.randperm(len(shard), generator=torch.Generator().manual_seed(epoch))]
        # Every rank takes the same number of steps (shards differ by at most one sample).
        steps = len(train) // P // a.batch
        total = torch.zeros(2)
        for s in range(steps):
            idx = perm[s * a.batch:(s + 1) * a.batch]
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += torch.tensor([loss.item() * len(idx), len(idx)])
        dist.all_reduce(total)
        with torch.no_grad():
            acc = (model(x[test]).argmax(1) == y[test]).float().mean().item()
        if rank == 0:
            rate = total[1].item() / (time.perf_counter() - t0)
            print(f"epoch {epoch:3d}  loss {total[0].item() / total[1].item():.4f}  "
                  f"test accuracy {100 * acc:5.1f}%  {rate:8.0f} samples/s", flush=True)
    if rank == 0:
        print(f"done: test accuracy {100 * acc:.1f}% after {a.epochs} epochs in "
              f"{time.perf_counter() - start:.1f} s", flush=True)
    dist.destroy_process_group()
    if 100 * acc < a.min_accuracy:
        raise SystemExit(f"test accuracy {100 * acc:.1f}% is below {a.min_accuracy}%")


if __name__ == "__main__":
    main()
