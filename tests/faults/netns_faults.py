#!/usr/bin/env python3
"""Network faults under a TCP job: ranks in network namespaces of their own, joined by an
impairment forwarder, running checked collectives (fault_rank). Results must be right, or the
error clean (timed_out / peer_lost, within the deadline); never wrong data.

usage: netns_faults.py FAULT_RANK CASE...     (no CASE: all of them)

Cases:
  delay       every frame 5 ms late (netem delay 5ms)
  loss        1% of frames dropped (netem loss 1%)
  reorder     every frame 5 ms late, a quarter of them 10 ms more, so later ones overtake them
              (netem delay 5ms reorder 75% 50%, roughly)
  all         delay, loss and reordering together
  flap        rank 1's link taken down mid-collective for 3 s, then up: the job completes
  down        rank 1's link taken down mid-collective for good: every rank fails cleanly by its
              deadline

Why not tc netem: this kernel may lack it (sch_netem). Each rank's namespace gets a TAP device
instead, whose other end is this script's forwarder process, a learning switch that delays,
drops and reorders frames itself; "link down" is `ip link set dev ... down` in the namespace.
Only traffic among the namespaces created here crosses the forwarder. Namespaces and devices are
removed on every path (finally, atexit, SIGTERM/SIGINT/SIGHUP). Exit: 0 pass, 1 fail, 77 skipped
(not root, no iproute2, no /dev/net/tun, or namespaces cannot be made).
"""

import atexit
import fcntl
import heapq
import os
import random
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000
RANKS = 3
CALLS, MAX_ELEMS = 40, 200000


class Skip(Exception):
    pass


def sh(*args, check=True):
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(args)}: {r.stderr.strip()}")
    return r


class Network:
    """RANKS namespaces, each with a TAP device (10.77.0.r+1/24) whose frames this process
    forwards through an impairment forwarder child."""

    def __init__(self, tag):
        if os.geteuid() != 0:
            raise Skip("network namespaces need root")
        if shutil.which("ip") is None:
            raise Skip("iproute2's ip is not installed")
        if not os.path.exists("/dev/net/tun"):
            raise Skip("/dev/net/tun is missing (no TUN/TAP)")
        self.names = [f"{tag}r{i}" for i in range(RANKS)]
        self.created, self.fds, self.forwarder, self.ctl = [], [], None, None
        atexit.register(self.cleanup)
        probe = sh("ip", "netns", "add", self.names[0], check=False)
        if probe.returncode != 0:
            raise Skip(f"cannot create a network namespace: {probe.stderr.strip()}")
        self.created.append(self.names[0])
        for ns in self.names[1:]:
            sh("ip", "netns", "add", ns)
            self.created.append(ns)
        self.addresses = [f"10.77.0.{i + 1}" for i in range(RANKS)]
        for i, ns in enumerate(self.names):
            dev = f"{tag}t{i}"[:15]
            fd = os.open("/dev/net/tun", os.O_RDWR)
            try:
                fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", dev.encode(), IFF_TAP | IFF_NO_PI))
            except OSError as e:
                os.close(fd)
                raise Skip(f"cannot create a TAP device: {e}")
            self.fds.append(fd)
            sh("ip", "link", "set", dev, "netns", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "link", "set", dev, "name", "eth0")
            sh("ip", "-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")

    def start_forwarder(self, delay_ms=0.0, loss=0.0, reorder=0.0, reorder_extra_ms=10.0, seed=1):
        rd, wr = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(wr)
            try:
                forward(self.fds, rd, delay_ms / 1000, loss, reorder, reorder_extra_ms / 1000, seed)
            finally:
                os._exit(0)
        os.close(rd)
        self.forwarder, self.ctl = pid, wr

    def stats(self):
        """Asks the forwarder for its counters: {'forwarded': n, 'dropped': n, 'reordered': n}."""
        path = tempfile.mktemp(prefix="cohort-netns-stats-")
        os.write(self.ctl, f"stats {path}\n".encode())
        for _ in range(200):
            if os.path.exists(path):
                time.sleep(0.05)
                with open(path) as f:
                    text = f.read()
                os.unlink(path)
                return dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", text))
            time.sleep(0.01)
        return {}

    def link(self, rank, up):
        sh("ip", "-n", self.names[rank], "link", "set", "eth0", "up" if up else "down")

    def command(self, rank, args):
        return ["ip", "netns", "exec", self.names[rank], *args]

    def cleanup(self):
        if self.forwarder:
            try:
                os.kill(self.forwarder, signal.SIGKILL)
                os.waitpid(self.forwarder, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.forwarder = None
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.created = []


def forward(fds, ctl, delay, loss, reorder, extra, seed):
    """A learning switch between TAP devices: frames leave `delay` late (plus `extra` for a
    `reorder` fraction of them, which later frames overtake), `loss` of them never."""
    rnd = random.Random(seed)
    where = {}  # MAC -> fd
    queue, seq = [], 0
    counters = {"forwarded": 0, "dropped": 0, "reordered": 0}
    for fd in fds:
        os.set_blocking(fd, False)
    poller = select.poll()
    for fd in fds + [ctl]:
        poller.register(fd, select.POLLIN)
    pending_ctl = b""
    while True:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, out, frame = heapq.heappop(queue)
            try:
                os.write(out, frame)
            except OSError:
                pass  # the link is down, or the device's queue is full: the frame is lost
        timeout = 50 if not queue else max(0, int((queue[0][0] - now) * 1000))
        for fd, _ in poller.poll(timeout):
            if fd == ctl:
                chunk = os.read(ctl, 4096)
                if not chunk:
                    return
                pending_ctl += chunk
                while b"\n" in pending_ctl:
                    line, pending_ctl = pending_ctl.split(b"\n", 1)
                    words = line.decode().split()
                    if words and words[0] == "stats":
                        with open(words[1] + ".tmp", "w") as f:
                            f.write(" ".join(f"{k}={v}" for k, v in counters.items()))
                        os.rename(words[1] + ".tmp", words[1])
                continue
            for _ in range(64):
                try:
                    frame = os.read(fd, 65536)
                except (BlockingIOError, OSError):
                    break
                if len(frame) < 14:
                    continue
                dst, src = frame[0:6], frame[6:12]
                where[src] = fd
                if loss and rnd.random() < loss:
                    counters["dropped"] += 1
                    continue
                due = time.monotonic() + delay
                if reorder and rnd.random() < reorder:
                    due += extra
                    counters["reordered"] += 1
                targets = [where[dst]] if dst in where and dst[0] & 1 == 0 else [f for f in fds if f != fd]
                for out in targets:
                    if out == fd:
                        continue
                    seq += 1
                    counters["forwarded"] += 1
                    if due <= time.monotonic():
                        try:
                            os.write(out, frame)
                        except OSError:
                            pass
                    else:
                        heapq.heappush(queue, (due, seq, out, frame))


class Job:
    def __init__(self, net, fault_rank, timeout_ms, job_id):
        self.procs, self.outs = [], []
        token = os.urandom(16).hex()  # ranks in namespaces of their own: a job across hosts
        for r in range(RANKS):
            env = {k: v for k, v in os.environ.items()
                   if not re.match(r"^(COHORT_|RANK$|WORLD_SIZE$|LOCAL_|MASTER_|TORCHELASTIC_|OMPI_|PMI_|SLURM_)", k)}
            env.update({"RANK": str(r), "WORLD_SIZE": str(RANKS), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": net.addresses[0], "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": job_id,
                        "COHORT_SOCKET_IFNAME": "eth0", "COHORT_TCP_SPIN_US": "0", "COHORT_TOKEN": token})
            out = tempfile.TemporaryFile(mode="w+")
            p = subprocess.Popen(net.command(r, [fault_rank, str(CALLS), str(MAX_ELEMS), str(timeout_ms)]),
                                 env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
            self.procs.append(p)
            self.outs.append(out)
        atexit.register(self.kill)

    def output(self, r):
        self.outs[r].flush()
        self.outs[r].seek(0)
        return self.outs[r].read()

    def progress(self, r):
        found = re.findall(r"progress (\d+)", self.output(r))
        return int(found[-1]) if found else -1

    def wait(self, limit):
        end = time.monotonic() + limit
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"the job hung past {limit} s\n{self.show()}")
        return [p.returncode for p in self.procs]

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()

    def show(self):
        return "".join(f"--- rank {r} (exit {p.returncode})\n{self.output(r)[-3000:]}" for r, p in enumerate(self.procs))


def run_case(case, fault_rank, tag):
    net = Network(tag)
    try:
        settings = {
            "delay": dict(delay_ms=5),
            "loss": dict(loss=0.01),
            "reorder": dict(delay_ms=5, reorder=0.25, reorder_extra_ms=10),
            "all": dict(delay_ms=5, loss=0.01, reorder=0.25, reorder_extra_ms=10),
            "flap": dict(delay_ms=1),
            "down": dict(delay_ms=1),
        }[case]
        net.start_forwarder(**settings)
        timeout_ms = 6000 if case == "down" else 60000
        start = time.monotonic()
        job = Job(net, fault_rank, timeout_ms, f"netns-{case}-{os.getpid()}")
        if case in ("flap", "down"):
            # Mid-collective: once every rank has done a few calls.
            end = time.monotonic() + 60
            while min(job.progress(r) for r in range(RANKS)) < 3:
                assert time.monotonic() < end, f"the job made no progress\n{job.show()}"
                assert all(p.poll() is None for p in job.procs), f"a rank ended early\n{job.show()}"
                time.sleep(0.01)
            net.link(1, up=False)
            downed = time.monotonic()
            if case == "flap":
                time.sleep(3)
                net.link(1, up=True)
        codes = job.wait(180)
        took = time.monotonic() - start
        text = job.show()
        stats = net.stats()
        assert "WRONG" not in text, f"a wrong result\n{text}"
        if case == "down":
            # Every rank ends cleanly: timed out, or lost a peer, by its deadline (6 s per call).
            for r in range(RANKS):
                m = re.search(rf"rank {r}: error (\w+) peer=(-?\d+) after=(\d+) ms", job.output(r))
                assert m and m.group(1) in ("timed_out", "peer_lost"), f"rank {r} did not fail cleanly\n{text}"
                assert int(m.group(3)) <= timeout_ms + 2500, f"rank {r} failed after its deadline\n{text}"
                assert codes[r] == 3, text
            noticed = time.monotonic() - downed
            said = ", ".join(f"rank {r}: " + re.search(rf"rank {r}: error (\w+)", job.output(r)).group(1) for r in range(RANKS))
            summary = f"every rank failed cleanly within {noticed:.1f} s of the link going down ({said})"
        else:
            assert codes == [0] * RANKS, f"exit codes {codes}\n{text}"
            for r in range(RANKS):
                assert re.search(rf"rank {r}: ok {CALLS} calls", job.output(r)), text
            summary = f"{CALLS} checked calls on every rank, all right"
        print(f"{case}: {summary}; {took:.1f} s; forwarder: {stats}")
        if case in ("loss", "all"):
            assert stats.get("dropped", 0) > 0, f"nothing was dropped: the case did not test loss ({stats})"
        if case in ("reorder", "all"):
            assert stats.get("reordered", 0) > 0, f"nothing was reordered ({stats})"
    finally:
        net.cleanup()


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    fault_rank = os.path.abspath(sys.argv[1])
    cases = sys.argv[2:] or ["delay", "loss", "reorder", "all", "flap", "down"]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, f: sys.exit(128 + s))  # runs atexit: namespaces, processes
    tag = f"cf{os.getpid() % 100000}"
    try:
        for i, case in enumerate(cases):
            run_case(case, fault_rank, f"{tag}{i}")
    except Skip as s:
        print(f"SKIP: {s}", file=sys.stderr)
        return 77
    except AssertionError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
