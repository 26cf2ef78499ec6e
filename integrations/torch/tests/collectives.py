"""Every collective of the cohort backend x dtype x op, against the gloo backend in the same job.

Integers must equal gloo's results exactly; floats must be bitwise equal across ranks and close
to gloo's (gloo has no fp16/bf16 reductions and no AVG: those are checked against a float64
reduction of every rank's input).
"""
import datetime
import faulthandler
import os
import sys
import time

import torch
import torch.distributed as dist

import cohort_torch
import fake_hosts  # noqa: F401

faulthandler.dump_traceback_later(150, exit=True)  # a hang shows where it is
R = dist.ReduceOp
dist.init_process_group("cohort", timeout=datetime.timedelta(seconds=60))
rank, P = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print(f"rank {rank}: FAILED {what}", flush=True)


def make(dtype, n, seed, small=False):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype.is_floating_point:
        x = torch.randn(n, generator=g, dtype=torch.float64)
        if small:  # products stay in range
            x = 0.5 + torch.rand(n, generator=g, dtype=torch.float64)
        return x.to(dtype)
    lo, hi = (-3, 4) if small else (-1000, 1000)
    return torch.randint(lo, hi, (n,), generator=g, dtype=dtype)


def strided(x):
    """A non-contiguous view holding x, beside a sentinel that must stay untouched."""
    base = torch.full((x.numel(), 2), 7, dtype=x.dtype)
    base[:, 0] = x
    return base, base[:, 0]


def same_on_every_rank(t):
    """True when every rank holds bitwise the same t (compared as bytes through gloo)."""
    t = t.clone(memory_format=torch.contiguous_format).reshape(-1).view(torch.uint8)
    rows = [torch.empty(t.shape, dtype=t.dtype) for _ in range(P)]
    dist.all_gather(rows, t, group=gloo)
    return all(torch.equal(r, t) for r in rows)


def b(t):
    """t, or for 16-bit floats its bytes (gloo moves those but lacks the types)."""
    return t.view(torch.uint8) if t.dtype in (torch.float16, torch.bfloat16) else t


def reference(x, op):
    """The float64 reduction of every rank's x (gathered through gloo)."""
    rows = [torch.empty_like(x, dtype=torch.float64) for _ in range(P)]
    dist.all_gather(rows, x.to(torch.float64), group=gloo)
    s = torch.stack(rows)
    return {R.SUM: s.sum(0), R.AVG: s.mean(0), R.PRODUCT: s.prod(0),
            R.MIN: s.min(0).values, R.MAX: s.max(0).values}[op]


def close(got, want, dtype, what):
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 2e-2,
           torch.bfloat16: 1e-1}[dtype]
    check(torch.allclose(got.to(torch.float64), want.to(torch.float64), rtol=tol, atol=tol * 4),
          f"{what}: max error {(got.to(torch.float64) - want.to(torch.float64)).abs().max()}")


FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64]
OPS = [R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX]
SIZES = [1, 13, 4099]

# all_reduce: dtype x op x size x (contiguous, strided)
for dtype in FLOATS + INTS:
    for op in OPS:
        for n in SIZES:
            for contiguous in (True, False):
                what = f"all_reduce {dtype} {op} n={n} {'contiguous' if contiguous else 'strided'}"
                x = make(dtype, n, n, small=op == R.PRODUCT)
                if op == R.AVG and not dtype.is_floating_point:
                    try:
                        dist.all_reduce(x.clone(), op=op)
                        check(False, what + ": AVG on integers should be refused")
                    except RuntimeError as e:
                        check("not supported by cohort" in str(e), f"{what}: message {e}")
                    continue
                if contiguous:
                    t, base = x.clone(), None
                else:
                    base, t = strided(x)
                dist.all_reduce(t, op=op)
                if base is not None:
                    check(bool((base[:, 1] == 7).all()), what + ": wrote outside the view")
                check(same_on_every_rank(t), what + ": ranks differ")
                gloo_ok = dtype in (torch.float32, torch.float64) + tuple(INTS) and op != R.AVG
                if gloo_ok:
                    g = x.clone()
                    dist.all_reduce(g, op=op, group=gloo)
                    if dtype.is_floating_point and op in (R.SUM, R.PRODUCT):
                        close(t, g, dtype, what)
                    else:
                        check(torch.equal(t, g), what + ": differs from gloo")
                else:
                    close(t, reference(x, op), dtype, what)

for dtype in FLOATS + INTS:
    n = 1031
    x = make(dtype, n, 5)
    tag = f"{dtype}"
    # broadcast from the last rank, strided
    base, t = strided(x)
    dist.broadcast(t, src=P - 1)
    g = x.clone()
    dist.broadcast(b(g), src=P - 1, group=gloo)
    check(torch.equal(t, g) and bool((base[:, 1] == 7).all()), f"broadcast {tag}")
    # all_gather (list) and _all_gather_base
    outs = [torch.empty_like(x) for _ in range(P)]
    dist.all_gather(outs, x)
    gouts = [torch.empty_like(x) for _ in range(P)]
    dist.all_gather([b(t) for t in gouts], b(x), group=gloo)
    check(all(torch.equal(a, b) for a, b in zip(outs, gouts)), f"all_gather {tag}")
    flat = torch.empty(P * n, dtype=dtype)
    dist._all_gather_base(flat, x)
    check(torch.equal(flat, torch.cat(gouts)), f"_all_gather_base {tag}")
    # reduce to rank 1 % P
    root = 1 % P
    t = x.clone()
    dist.reduce(t, dst=root, op=R.SUM)
    if dtype in INTS:
        want = x.clone()
        dist.all_reduce(want, group=gloo)
    else:
        want = reference(x, R.SUM)
    if rank == root and dtype in INTS:
        check(torch.equal(t, want), f"reduce {tag}")
    elif rank == root:
        close(t, want, dtype, f"reduce {tag}")
    else:
        check(torch.equal(t, x), f"reduce {tag}: a non-root's input changed")
    # reduce_scatter (list) and _reduce_scatter_base, SUM and MAX
    for op in (R.SUM, R.MAX):
        big = make(dtype, P * n, 9)
        out = torch.empty(n, dtype=dtype)
        dist.reduce_scatter(out, list(big.chunk(P)), op=op)
        out2 = torch.empty(n, dtype=dtype)
        dist._reduce_scatter_base(out2, big, op=op)
        check(torch.equal(out, out2), f"reduce_scatter list vs base {tag} {op}")
        if dtype in INTS or (op == R.MAX and dtype in (torch.float32, torch.float64)):
            want = big.clone()
            dist.all_reduce(want, op=op, group=gloo)
            want = want.chunk(P)[rank]
            check(torch.equal(out, want), f"reduce_scatter {tag} {op}")
        else:
            close(out, reference(big, op).chunk(P)[rank], dtype, f"reduce_scatter {tag} {op}")
    # gather and scatter to / from rank 0
    outs = [torch.empty_like(x) for _ in range(P)] if rank == 0 else None
    dist.gather(x, outs, dst=0)
    if rank == 0:
        check(all(torch.equal(a, b) for a, b in zip(outs, gouts)), f"gather {tag}")
    got = torch.empty_like(x)
    pieces = [make(dtype, n, 100 + q) for q in range(P)] if rank == 0 else None
    dist.scatter(got, pieces, src=0)
    want = torch.empty_like(x)
    dist.scatter(b(want), [b(p) for p in pieces] if pieces else None, src=0, group=gloo)
    check(torch.equal(got, want), f"scatter {tag}")
    # all_to_all_single with equal splits
    a = make(dtype, P * 5, 11)
    o = torch.empty_like(a)
    dist.all_to_all_single(o, a)
    rows = [torch.empty_like(a) for _ in range(P)]
    dist.all_gather([b(r) for r in rows], b(a), group=gloo)
    check(torch.equal(o, torch.cat([r.chunk(P)[rank] for r in rows])), f"all_to_all_single {tag}")
    ol = [torch.empty(5, dtype=dtype) for _ in range(P)]
    dist.all_to_all(ol, list(a.chunk(P)))
    check(torch.equal(torch.cat(ol), o), f"all_to_all {tag}")

# Asynchronous work: several in flight, completing in order with their outputs.
ts = [torch.full((100000,), float(rank + i)) for i in range(6)]
works = [dist.all_reduce(t, async_op=True) for t in ts]
futs = [w.get_future() for w in works]
for i, (w, f) in enumerate(zip(works, futs)):
    check(w.wait(timeout=datetime.timedelta(seconds=30)), f"async wait {i}")
    check(w.is_completed(), f"async is_completed {i}")
    v = f.wait()
    want = float(sum(r + i for r in range(P)))
    check(isinstance(v, list) and len(v) == 1 and torch.all(v[0] == want).item()
          and v[0] is not None and torch.all(ts[i] == want).item(), f"async future {i}")
w = dist.barrier(async_op=True)
w.wait()
check(w.is_completed(), "async barrier")

# wait(timeout) gives up on work still in flight, which completes later.
t = torch.ones(10)
if rank == 0:
    w = dist.all_reduce(t, async_op=True)
    check(not w.is_completed(), "async: in flight while the other ranks have not called")
    try:
        w.wait(timeout=datetime.timedelta(milliseconds=300))
        check(False, "async: wait(timeout) should time out")
    except RuntimeError as e:
        check("timed out" in str(e).lower(), f"async: wait(timeout) message: {e}")
    check(w.wait(), "async: the late work completes")
else:
    time.sleep(1.5)
    dist.all_reduce(t)
check(torch.equal(t, torch.full((10,), float(P))), "async: the late all_reduce's result")

# Point-to-point is not built from collectives: a clear error, and the group goes on.
try:
    dist.send(torch.zeros(1), dst=(rank + 1) % P)
    check(False, "send should be refused")
except RuntimeError as e:
    check("not supported by cohort" in str(e), f"send message: {e}")
try:
    dist.all_to_all_single(torch.empty(P), torch.zeros(P), [1] * P, [1] * P)
    check(False, "uneven all_to_all should be refused")
except RuntimeError as e:
    check("not supported by cohort" in str(e), f"all_to_all splits message: {e}")
t = torch.ones(3)
dist.all_reduce(t)
check(torch.equal(t, torch.full((3,), float(P))), "all_reduce after refusals")

# A cohort subgroup (the even ranks) beside the whole group.
evens = dist.new_group(list(range(0, P, 2)), backend="cohort")
t = torch.ones(4)
if rank % 2 == 0:
    dist.all_reduce(t, group=evens)
    check(torch.equal(t, torch.full((4,), float(len(range(0, P, 2))))), "all_reduce on a subgroup")

# Ranks that disagree about a call: every rank gets cohort's mismatch message as RuntimeError
# (on a group of its own, which the failure leaves poisoned).
bad = dist.new_group(backend="cohort")
try:
    dist.all_reduce(torch.ones(3 if rank == 0 else 5), group=bad)
    check(False, "mismatched all_reduce should fail")
except RuntimeError as e:
    check("all_reduce" in str(e) and ("3" in str(e) or "5" in str(e)), f"mismatch message: {e}")
try:
    dist.all_reduce(torch.ones(1), group=bad)
    check(False, "a poisoned group should refuse calls")
except RuntimeError as e:
    check("poison" in str(e) or "all_reduce" in str(e), f"poisoned message: {e}")

wanted = os.environ.get("COHORT_TRANSPORT", "")
check(not wanted or cohort_torch.transport() == wanted,
      f"transport {cohort_torch.transport()}, COHORT_TRANSPORT={wanted}")
dist.barrier()
print(f"rank {rank}: transport {cohort_torch.transport()}, "
      f"{'FAILED ' + str(len(failures)) if failures else 'all passed'}", flush=True)
# A gloo worker thread may drop its last reference to a call's tensors just after the call
# returns; doing that while the interpreter exits aborts the process (torch 1.13). Deleting the
# group joins its threads (with the GIL released) before the exit.
dist.destroy_process_group(gloo)
del gloo
dist.destroy_process_group()
sys.exit(1 if failures else 0)
