"""DDP training throughput of resnet18 on two "hosts": cohort against gloo and torch's own
gradient compression, over a link shaped to 1 Gbit/s.

    PYTHONPATH=BUILD/integrations/torch:integrations/torch \\
      /usr/bin/python3 bench/torch/ddp_resnet.py [--rounds 3] [--steps 8] [--batch 8]

Needs root (it makes two network namespaces). Each rank runs in a namespace of its own, started
with `ip netns exec NS /usr/bin/python3 ...`; the two are joined by a veth pair (10.77.0.1/24
and 10.77.0.2/24) with a `tc tbf` qdisc of 1 Gbit/s on both ends, so each direction carries at
most 1 Gbit/s. The namespaces (and with them the veth pair) are removed on every exit path.
Rendezvous: init_process_group(init_method="tcp://10.77.0.1:PORT", rank, world_size=2);
cohort runs with COHORT_TRANSPORT=tcp, COHORT_SOCKET_IFNAME=<the rank's veth> and a random
COHORT_TOKEN shared by both ranks; gloo with GLOO_SOCKET_IFNAME.

The model is torchvision's resnet18(weights=None) (11.7 M parameters, 44.6 MiB of float32
gradients per step), fed one fixed batch of synthetic 3x64x64 images with random labels per
rank, SGD with momentum, OMP_NUM_THREADS=1 per rank. Configurations: gloo; cohort; cohort with
cohort_torch.hooks.bf16; cohort with cohort_torch.hooks.top_k(0.01, error_feedback=True); gloo
with torch's fp16_compress_hook; gloo with PowerSGD (rank 1, from iteration 2).

Every configuration is one fresh pair of processes per round, the configurations interleaved
round by round (the order rotates). In each run: --warmup steps, then --steps timed DDP steps
and as many steps under model.no_sync() (forward, backward and the optimizer, no gradient
exchange), alternating in blocks of --block steps that each start at a barrier and last as
long as the slower rank. samples/s = 2 ranks x batch x timed steps / the DDP blocks' time. The
share of the step spent waiting for communication is 1 - compute-only time / DDP step time:
what back-propagation did not hide, including the CPU the exchange takes from it. Then the
exchange alone: one gradient-sized float32 tensor through the same path (all_reduce, the
cohort codec, or fp16_compress_hook's cast + all_reduce; PowerSGD exists only inside DDP),
nothing else running in the job. Medians over the rounds with [min..max]; ratios against gloo
are taken within each round, then the median. A run that fails is run again once (--retries)
and counted; no run starts that would likely end after --deadline.
"""
import argparse
import atexit
import json
import os
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

CONFIGS = ["gloo", "cohort", "cohort+bf16", "cohort+top_k", "gloo+fp16_hook", "gloo+powersgd"]
ADDR = ["10.77.0.1", "10.77.0.2"]


# ------------------------------------------------------------------------------------------
# worker: one rank of one configuration, inside its namespace
# ------------------------------------------------------------------------------------------

def worker(a):
    t_proc = time.perf_counter()
    import datetime

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import torchvision
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    backend = a.config.split("+")[0]
    if backend == "cohort":
        import cohort_torch  # registers the backend
    t_start = time.perf_counter()
    dist.init_process_group(backend, init_method=f"tcp://{ADDR[0]}:{a.port}", rank=a.rank,
                            world_size=2, timeout=datetime.timedelta(seconds=a.init_timeout))
    t_init = time.perf_counter() - t_start

    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts them)
    model = DDP(torchvision.models.resnet18(weights=None))
    hook = a.config.split("+")[1] if "+" in a.config else None
    if hook == "bf16":
        model.register_comm_hook(None, cohort_torch.hooks.bf16)
    elif hook == "top_k":
        model.register_comm_hook(None, cohort_torch.hooks.top_k(0.01, error_feedback=True))
    elif hook == "fp16_hook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif hook is not None:
        raise SystemExit(f"unknown hook {hook}")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(1 + a.rank)
    x = torch.randn(a.batch, 3, a.image, a.image, generator=g)
    y = torch.randint(0, 1000, (a.batch,), generator=g)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(a.warmup):
        step()
    t_ready = time.perf_counter() - t_proc
    # Timed blocks alternate: --block DDP steps, then --block steps under no_sync() (forward,
    # backward and the optimizer without the gradient exchange), so that both see the same
    # load from whatever else runs on the machine. Each block starts at a barrier.
    blocks = max(1, a.steps // a.block)
    times = torch.zeros(2 * blocks, dtype=torch.float64)
    cpu = torch.zeros(2 * blocks, dtype=torch.float64)  # CPU seconds of the process (all threads)

    def cpu_now():
        t = os.times()
        return t.user + t.system

    mismatch = None
    for b in range(blocks):
        dist.barrier()
        t0, c0 = time.perf_counter(), cpu_now()
        for _ in range(a.block):
            loss = step()
        times[2 * b], cpu[2 * b] = time.perf_counter() - t0, cpu_now() - c0
        if mismatch is None:
            # The replicas must be equal (every configuration applies the same averaged
            # update), checked before the first no_sync() step lets them drift apart.
            with torch.no_grad():
                flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
                sig = torch.stack([flat.sum(), flat.abs().sum()])
                hi, lo = sig.clone(), sig.clone()
                dist.all_reduce(hi, op=dist.ReduceOp.MAX)
                dist.all_reduce(lo, op=dist.ReduceOp.MIN)
                mismatch = ((hi - lo).abs() / lo.abs().clamp_min(1e-30)).max().item()
        dist.barrier()
        t0, c0 = time.perf_counter(), cpu_now()
        with model.no_sync():
            for _ in range(a.block):
                step()
        times[2 * b + 1], cpu[2 * b + 1] = time.perf_counter() - t0, cpu_now() - c0
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # each block as long as its slower rank
    dist.all_reduce(cpu, op=dist.ReduceOp.SUM)
    cpu /= 2  # per rank
    n = blocks * a.block
    full, compute = times[0::2].sum().item(), times[1::2].sum().item()
    # The gradient exchange alone, with nothing else running in the job: one flat float32
    # tensor as large as all gradients (the hooks see it bucket by bucket), --probe-reps times.
    exchange = None
    numel = sum(p.numel() for p in model.parameters())
    if a.probe_reps > 0 and hook != "powersgd":  # PowerSGD exists only inside DDP
        grads = torch.randn(numel, generator=g)
        if hook in ("bf16", "top_k"):
            import _cohort_torch
            pg = dist.distributed_c10d._get_default_group()
            # What the hook calls, with a residual of its own (index 1000: no DDP bucket's).
            ex = lambda: _cohort_torch.compressed_allreduce(pg, grads, hook, 0.01, True,
                                                            1000).wait()
        elif hook == "fp16_hook":
            def ex():  # what fp16_compress_hook does
                half = grads.to(torch.float16).div_(2)
                dist.all_reduce(half)
                grads.copy_(half)
        else:
            ex = lambda: dist.all_reduce(grads)
        ex()
        took = []
        for _ in range(a.probe_reps):
            dist.barrier()
            t0 = time.perf_counter()
            ex()
            took.append(time.perf_counter() - t0)
        t = torch.tensor(took, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        exchange = t.median().item()
    dist.barrier()
    if a.rank == 0:
        extra = {"transport": cohort_torch.transport()} if backend == "cohort" else {}
        print("RESULT " + json.dumps({
            "config": a.config, "step_s": full / n, "compute_s": compute / n,
            "step_cpu_s": cpu[0::2].sum().item() / n, "compute_cpu_s": cpu[1::2].sum().item() / n,
            "samples_per_s": 2 * a.batch * n / full,
            "nocomm_samples_per_s": 2 * a.batch * n / compute,
            "comm_share": 1 - compute / full, "replica_mismatch": mismatch,
            "loss": loss, "init_s": t_init, "ready_s": t_ready, "exchange_s": exchange,
            "grad_numel": numel, **extra}), flush=True)
    dist.destroy_process_group()


def link_check(a):
    """--link-check server|client: how fast 64 MiB crosses the shaped link (one direction)."""
    n = 64 << 20
    if a.link_check == "server":
        with socket.create_server((ADDR[0], a.port)) as srv:
            srv.settimeout(30)
            c, _ = srv.accept()
            with c:
                c.settimeout(30)
                got = 0
                while got < n:
                    b = c.recv(1 << 20)
                    if not b:
                        break
                    got += len(b)
                c.sendall(b"k")
    else:
        buf = b"\0" * (1 << 20)
        deadline = time.time() + 20
        while True:
            try:
                c = socket.create_connection((ADDR[0], a.port), timeout=30)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)
        with c:
            t0 = time.perf_counter()
            for _ in range(n // len(buf)):
                c.sendall(buf)
            c.recv(1)
            print(f"LINK {n * 8 / (time.perf_counter() - t0) / 1e9:.3f}", flush=True)


# ------------------------------------------------------------------------------------------
# driver: namespaces, the rounds, the table
# ------------------------------------------------------------------------------------------

class Namespaces:
    """Two network namespaces joined by a shaped veth pair; `close` removes them (idempotent)."""

    def __init__(self, rate, burst, latency):
        tag = f"{os.getpid()}"
        self.ns = [f"cohortddp{tag}a", f"cohortddp{tag}b"]
        self.dev = [f"cdp{tag}a", f"cdp{tag}b"]
        self.made = []
        self.procs = []  # Popen objects of our processes inside the namespaces
        self.rate, self.burst, self.latency = rate, burst, latency

    @staticmethod
    def ip(*args, check=True):
        r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
        if check and r.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
        return r

    @classmethod
    def remove_stale(cls):
        """Removes namespaces an earlier run of this script left (killed by SIGKILL)."""
        r = cls.ip("netns", "list", check=False)
        for line in r.stdout.splitlines():
            name = line.split()[0] if line.split() else ""
            m = re.fullmatch(r"cohortddp(\d+)[ab]", name)
            if m and not os.path.exists(f"/proc/{m.group(1)}"):
                cls.ip("netns", "del", name, check=False)

    def open(self):
        self.remove_stale()
        for ns in self.ns:
            self.ip("netns", "add", ns)
            self.made.append(ns)
        self.ip("link", "add", self.dev[0], "netns", self.ns[0], "type", "veth",
                "peer", "name", self.dev[1], "netns", self.ns[1])
        for i in (0, 1):
            ns, dev = self.ns[i], self.dev[i]
            self.ip("-n", ns, "link", "set", "lo", "up")
            self.ip("-n", ns, "addr", "add", f"{ADDR[i]}/24", "dev", dev)
            self.ip("-n", ns, "link", "set", dev, "up")
            r = subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
                                "rate", self.rate, "burst", self.burst, "latency", self.latency],
                               capture_output=True, text=True, timeout=20)
            if r.returncode != 0:
                raise RuntimeError(f"tc on {dev}: {r.stderr.strip()}")

    def qdisc(self):
        r = subprocess.run(["tc", "-n", self.ns[0], "qdisc", "show", "dev", self.dev[0]],
                           capture_output=True, text=True, timeout=20)
        return r.stdout.strip()

    def spawn(self, i, argv, env, out, err):
        p = subprocess.Popen(["ip", "netns", "exec", self.ns[i], *argv], env=env, stdout=out,
                             stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)
        return p

    def kill(self, p):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def close(self):
        for p in self.procs:
            self.kill(p)
        self.procs = []
        while self.made:
            ns = self.made.pop()
            # Anything still inside is ours (the namespace is private to this run).
            r = self.ip("netns", "pids", ns, check=False)
            for pid in r.stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            self.ip("netns", "del", ns, check=False)


def run_pair(nets, argv_of, timeout, tmp, name):
    """Starts rank 0 and rank 1 (argv_of(rank)), waits at most `timeout` s for both; returns
    (rc0, rc1, stdout0, stderr of both)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    procs, files = [], []
    for r in (0, 1):
        out = open(os.path.join(tmp, f"{name}.{r}.out"), "w+")
        err = open(os.path.join(tmp, f"{name}.{r}.err"), "w+")
        files.append((out, err))
        e = dict(env, COHORT_SOCKET_IFNAME="=" + nets.dev[r], GLOO_SOCKET_IFNAME=nets.dev[r])
        procs.append(nets.spawn(r, argv_of(r), e, out, err))
    deadline = time.monotonic() + timeout
    rcs = []
    for p in procs:
        try:
            rcs.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            rcs.append(None)
    for p in procs:
        nets.kill(p)
        nets.procs.remove(p)
    texts = []
    for out, err in files:
        out.seek(0)
        err.seek(0)
        texts.append((out.read(), err.read()))
        out.close()
        err.close()
    return rcs, texts


def _s(v):
    return "-" if v is None else f"{v:.3f} s"


def med(values):
    return f"{statistics.median(values):.3f}" if values else "-"


def fmt(values, spec):
    if not values:
        return "-"
    return (f"{statistics.median(values):{spec}} [{min(values):{spec}}.."
            f"{max(values):{spec}}]")


def driver(a):
    if os.geteuid() != 0:
        raise SystemExit("ddp_resnet.py needs root: it makes network namespaces")
    configs = a.configs.split(",")
    for c in configs:
        if c not in CONFIGS:
            raise SystemExit(f"unknown configuration {c}; known: {','.join(CONFIGS)}")
    if "gloo" not in configs:
        configs.insert(0, "gloo")  # the reference of every ratio
    start = time.monotonic()
    nets = Namespaces(a.rate, a.burst, a.latency)
    atexit.register(nets.close)

    def on_signal(sig, _frame):
        raise SystemExit(128 + sig)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    me = os.path.abspath(__file__)
    token = secrets.token_hex(32)
    os.environ.update(COHORT_TRANSPORT="tcp", COHORT_TOKEN=token)
    results = {c: [] for c in configs}
    ratios = {c: [] for c in configs}
    ceiling = []  # no_sync() samples/s of every run / gloo's samples/s in its round
    failures, skipped = [], []
    last_wall = 0.0  # the longest run so far
    port = 29500
    try:
        nets.open()
        with tempfile.TemporaryDirectory(prefix="ddp_resnet.") as tmp:
            rcs, texts = run_pair(
                nets, lambda r: [sys.executable, me, "--link-check",
                                 "server" if r == 0 else "client", "--port", str(port)],
                60, tmp, "link")
            link = next((ln.split()[1] for ln in texts[1][0].splitlines()
                         if ln.startswith("LINK ")), "?")
            print(f"link: {nets.qdisc()}", flush=True)
            print(f"link check: 64 MiB one way at {link} Gbit/s", flush=True)
            print(f"resnet18, batch {a.batch} per rank of 3x{a.image}x{a.image}, 2 ranks, "
                  f"{a.warmup} warm-up + {a.steps} timed steps, {a.rounds} rounds", flush=True)
            for rnd in range(a.rounds):
                k = rnd % len(configs)
                order = configs[k:] + configs[:k]
                this_round = {}
                for c in order:
                    for attempt in range(1 + a.retries):
                        # Start no run that would likely end after --deadline.
                        if time.monotonic() - start + last_wall > a.deadline:
                            skipped.append(f"round {rnd + 1} {c}")
                            res = None
                            break
                        port += 1
                        argv = lambda r: [sys.executable, me, "--worker", "--config", c,
                                          "--rank", str(r), "--port", str(port),
                                          "--batch", str(a.batch), "--image", str(a.image),
                                          "--steps", str(a.steps), "--block", str(a.block),
                                          "--warmup", str(a.warmup),
                                          "--probe-reps", str(a.probe_reps),
                                          "--init-timeout", str(a.init_timeout)]
                        t0 = time.monotonic()
                        rcs, texts = run_pair(nets, argv, a.run_timeout, tmp,
                                              f"r{rnd}.{c}.{attempt}")
                        last_wall = max(last_wall, time.monotonic() - t0)
                        res = next((json.loads(ln[7:]) for ln in texts[0][0].splitlines()
                                    if ln.startswith("RESULT ")), None)
                        if res is not None and rcs == [0, 0]:
                            break
                        res = None
                        why = "timed out" if None in rcs else f"exit {rcs}"
                        tail = (texts[0][1] + texts[1][1]).strip().splitlines()[-a.log_lines:]
                        failures.append(f"round {rnd + 1} {c} (attempt {attempt + 1}): {why}: "
                                        + " | ".join(ln.strip() for ln in tail))
                        print(f"round {rnd + 1} {c}: FAILED ({why})", flush=True)
                        for ln in tail:
                            print(f"    {ln}", flush=True)
                    if res is None:
                        continue
                    this_round[c] = res
                    results[c].append(res)
                    label = c + (f" ({res['transport']})" if "transport" in res else "")
                    print(f"round {rnd + 1} {label:>21}: {res['samples_per_s']:6.2f} samples/s, "
                          f"step {res['step_s']:.3f} s, compute-only {res['compute_s']:.3f} s, "
                          f"comm wait {100 * res['comm_share']:4.1f}%, exchange alone "
                          f"{_s(res['exchange_s'])}, CPU per step {res['step_cpu_s']:.3f} s "
                          f"(no_sync {res['compute_cpu_s']:.3f} s), replicas "
                          f"{res['replica_mismatch']:.1e} apart ({time.monotonic() - t0:.0f} s)",
                          flush=True)
                if "gloo" in this_round:
                    ref = this_round["gloo"]["samples_per_s"]
                    for c, res in this_round.items():
                        ratios[c].append(res["samples_per_s"] / ref)
                        ceiling.append(res["nocomm_samples_per_s"] / ref)
    finally:
        nets.close()

    print(f"\nmedian of {a.rounds} rounds [min..max]; x gloo: ratio to gloo's samples/s in the "
          f"same round; comm wait: 1 - compute-only / step; exposed comm: step - compute-only; "
          f"exchange alone: one gradient-sized "
          f"({results['gloo'][0]['grad_numel'] if results['gloo'] else '?'} float32) "
          f"exchange with nothing else running in the job; CPU s/step: user + system CPU "
          f"time of one rank's process per step (median)", flush=True)
    hdr = (f"| {'configuration':<30} | {'samples/s':<21} | {'x gloo':<19} | "
           f"{'step s':<21} | {'compute-only s':<21} | {'comm wait %':<16} | "
           f"{'exposed comm s':<21} | {'exchange alone s':<21} | {'CPU s/step':<13} |")
    print(hdr)
    print("|" + "|".join("-" * (len(c)) for c in hdr.split("|")[1:-1]) + "|")
    names = {"gloo": "gloo", "cohort": "cohort",
             "cohort+bf16": "cohort + hooks.bf16",
             "cohort+top_k": "cohort + hooks.top_k(0.01, ef)",
             "gloo+fp16_hook": "gloo + fp16_compress_hook",
             "gloo+powersgd": "gloo + PowerSGD rank 1"}
    for c in configs:
        rs = results[c]
        print(f"| {names[c]:<30} | {fmt([r['samples_per_s'] for r in rs], '.2f'):<21} | "
              f"{fmt(ratios[c], '.2f'):<19} | {fmt([r['step_s'] for r in rs], '.3f'):<21} | "
              f"{fmt([r['compute_s'] for r in rs], '.3f'):<21} | "
              f"{fmt([100 * r['comm_share'] for r in rs], '.0f'):<16} | "
              f"{fmt([r['step_s'] - r['compute_s'] for r in rs], '.3f'):<21} | "
              f"{fmt([r['exchange_s'] for r in rs if r['exchange_s'] is not None], '.3f'):<21} | "
              f"{med([r['step_cpu_s'] for r in rs]):<13} |", flush=True)
    # The ceiling: the no_sync() blocks of every run, as samples/s, against gloo's round.
    every = [r for c in configs for r in results[c]]
    print(f"| {'no exchange (no_sync blocks)':<30} | "
          f"{fmt([r['nocomm_samples_per_s'] for r in every], '.2f'):<21} | "
          f"{fmt(ceiling, '.2f'):<19} | {'':<21} | "
          f"{fmt([r['compute_s'] for r in every], '.3f'):<21} | "
          f"{'':<16} | {'':<21} | {'':<21} | {med([r['compute_cpu_s'] for r in every]):<13} |",
          flush=True)
    print(f"wall: {time.monotonic() - start:.0f} s", flush=True)
    for f in failures:
        print(f"FAILED {f}", flush=True)
    for f in skipped:
        print(f"NOT RUN (--deadline) {f}", flush=True)
    for c in configs:
        n = sum(f.startswith("round ") and f.split()[2] == c for f in failures)
        if n:
            print(f"{c}: {n} failed run(s), {len(results[c])} of {a.rounds} rounds measured",
                  flush=True)
    incomplete = [c for c in configs if len(results[c]) < a.rounds]
    return 1 if incomplete else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8, help="timed steps per run (and as many "
                    "compute-only steps)")
    ap.add_argument("--block", type=int, default=2,
                    help="timed DDP steps and no_sync() steps alternate in blocks of this many")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (>= 3: PowerSGD "
                    "compresses from step 2)")
    ap.add_argument("--batch", type=int, default=8, help="samples per rank per step")
    ap.add_argument("--probe-reps", type=int, default=3,
                    help="times each run exchanges a gradient-sized tensor alone (0: never)")
    ap.add_argument("--image", type=int, default=64, help="image side in pixels")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--rate", default="1gbit", help="tc tbf rate on each end of the link")
    ap.add_argument("--burst", default="256kb")
    ap.add_argument("--latency", default="10ms")
    ap.add_argument("--retries", type=int, default=1,
                    help="runs again a configuration whose run failed, at most this many times")
    ap.add_argument("--run-timeout", type=float, default=150, help="seconds per run (2 ranks)")
    ap.add_argument("--init-timeout", type=float, default=60, help="init_process_group timeout")
    ap.add_argument("--deadline", type=float, default=570,
                    help="no run starts that would likely end later than this many seconds "
                    "after the start")
    ap.add_argument("--log-lines", type=int, default=8,
                    help="lines of a failed run's stderr to show")
    # internal
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--link-check", choices=["server", "client"], help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=29500, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.link_check:
        link_check(a)
    elif a.worker:
        worker(a)
    else:
        sys.exit(driver(a))


if __name__ == "__main__":
    main()
