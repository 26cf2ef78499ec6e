"""DDP on a small MLP for 20 steps on the cohort backend and on gloo, in one job: the same
parameters at the end; with each cohort hook, training still converges and every rank holds
bitwise the same parameters."""
import datetime
import faulthandler
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import cohort_torch
import fake_hosts  # noqa: F401

faulthandler.dump_traceback_later(200, exit=True)
dist.init_process_group("cohort", timeout=datetime.timedelta(seconds=60))
rank, P = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
torch.set_num_threads(1)
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
    print(f"rank {rank}: {'ok' if ok else 'FAILED'} {what}", flush=True)


# A separable 4-class problem; each rank its own shard.
g = torch.Generator().manual_seed(1)
W = torch.randn(20, 4, generator=g)
X = torch.randn(512, 20, generator=torch.Generator().manual_seed(100 + rank))
Y = (X @ W).argmax(1)


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 4))


def train(group, hook=None, steps=20):
    m = DDP(model(), process_group=group, bucket_cap_mb=0.01)  # several buckets
    if hook is not None:
        m.register_comm_hook(None, hook)
    opt = torch.optim.SGD(m.parameters(), lr=0.2, momentum=0.9)
    losses = []
    for step in range(steps):
        idx = torch.arange(step * 64, step * 64 + 64) % len(X)
        loss = nn.functional.cross_entropy(m(X[idx]), Y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    full = nn.functional.cross_entropy(m(X), Y).item()
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()]), losses, full


def same_on_every_rank(t):
    t = t.contiguous().view(torch.uint8)
    rows = [torch.empty_like(t) for _ in range(P)]
    dist.all_gather(rows, t, group=gloo)
    return all(torch.equal(r, t) for r in rows)


params_c, losses_c, full_c = train(None)
params_g, losses_g, full_g = train(gloo)
err = (params_c - params_g).abs().max().item()
check(torch.allclose(params_c, params_g, rtol=1e-4, atol=1e-5),
      f"cohort and gloo end with the same parameters (max difference {err:.2e})")
check(same_on_every_rank(params_c), "cohort: every rank the same parameters")
first = nn.functional.cross_entropy(model()(X), Y).item()
check(full_c < 0.6 * first, f"cohort: loss {first:.3f} -> {full_c:.3f}")

hooks = {"fp16": cohort_torch.hooks.fp16, "bf16": cohort_torch.hooks.bf16,
         "int8": cohort_torch.hooks.int8, "top_k(0.1)": cohort_torch.hooks.top_k(0.1),
         "top_k(0.1) no feedback": cohort_torch.hooks.top_k(0.1, error_feedback=False)}
for name, hook in hooks.items():
    params, losses, full = train(None, hook, steps=30)
    check(same_on_every_rank(params), f"hook {name}: every rank the same parameters")
    limit = 0.8 if name.startswith("top_k") else 0.6
    check(full < limit * first, f"hook {name}: loss {first:.3f} -> {full:.3f}")

dist.barrier()
print(f"rank {rank}: {'FAILED ' + str(len(failures)) if failures else 'all passed'}", flush=True)
# A gloo worker thread may drop its last reference to a call's tensors just after the call
# returns; doing that while the interpreter exits aborts the process (torch 1.13). Deleting the
# group joins its threads (with the GIL released) before the exit.
dist.destroy_process_group(gloo)
del gloo
dist.destroy_process_group()
sys.exit(1 if failures else 0)
