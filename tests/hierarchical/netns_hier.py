#!/usr/bin/env python3
"""The hierarchical communicator across network namespaces posing as hosts.

Each host is a network namespace joined to a bridge (in a switch namespace of its own) by a veth
pair, its end named eth0 with 10.98.0.(h+1)/24 and its egress shaped with tc tbf at RATE. The
ranks of a host run in its namespace (`ip netns exec`), sharing /dev/shm, which network
namespaces do not separate: shared memory inside a host, TCP between hosts. Every rank gets
torchrun's variables, COHORT_HOST naming its host, COHORT_SOCKET_IFNAME=eth0 and the job's
COHORT_TOKEN; rank 0 hosts the store at host 0's address.

usage: netns_hier.py CASE HIER_RANK HxL RATE
  suite       the collective suite on every rank (hier_rank suite)
  kill_host   all_reduce in a loop; SIGKILL every rank of the last host; every survivor must fail
              with peer_lost or timed_out within the deadline
  kill_rank   the same, killing one rank (local rank 1 of host 0)
  kill_rank0  the same, killing rank 0 (which hosts the store)

Also a library for bench/hierarchical/netns_bench.py (`Hosts`, `start_ranks`). Every wait is
bounded; namespaces and processes are removed on every path, and so is whatever the job left in
/dev/shm. Exit status: 0 pass, 1 fail, 77 skipped (no root, iproute2, tc or tbf).
"""

import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tcp"))
from tcp_test import Job, Skip, run, torchrun_env  # noqa: E402

DEADLINE = 10  # seconds: each all_reduce's deadline in hier_rank loop


class Hosts:
    """`hosts` namespaces on a bridge, each's egress shaped with tbf at `rate` (None: unshaped).
    cleanup() removes them; it runs at exit and on SIGTERM/SIGINT/SIGHUP."""

    def __init__(self, hosts, rate=None):
        if os.geteuid() != 0:
            raise Skip("network namespaces need root")
        for tool, pkg in (("ip", "iproute2"), ("tc", "iproute2's tc")):
            if shutil.which(tool) is None:
                raise Skip(f"{tool} ({pkg}) is not installed")
        tag = f"chh{os.getpid()}"
        self.switch = f"{tag}s"
        self.names = [f"{tag}h{i}" for i in range(hosts)]
        self.addrs = [f"10.98.0.{i + 1}" for i in range(hosts)]
        self.created = []
        atexit.register(self.cleanup)
        probe = subprocess.run(["ip", "netns", "add", self.switch], capture_output=True, text=True)
        if probe.returncode != 0:
            raise Skip(f"cannot create a network namespace: {probe.stderr.strip()}")
        self.created.append(self.switch)
        ip(self.switch, "link", "set", "lo", "up")
        ip(self.switch, "link", "add", "br0", "type", "bridge")
        ip(self.switch, "link", "set", "br0", "up")
        for i, ns in enumerate(self.names):
            run(["ip", "netns", "add", ns])
            self.created.append(ns)
            ip(ns, "link", "set", "lo", "up")
            ip(self.switch, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            ip(self.switch, "link", "set", f"p{i}", "master", "br0")
            ip(self.switch, "link", "set", f"p{i}", "up")
            ip(ns, "addr", "add", f"{self.addrs[i]}/24", "dev", "eth0")
            ip(ns, "link", "set", "eth0", "up")
        self.shaping = "none"
        if rate:
            self.shape(rate)

    def shape(self, rate):
        """tbf at `rate` on every host's eth0 (what the host sends); burst of about 4 ms."""
        bits = parse_rate(rate)
        burst = max(64 * 1024, bits // 8 // 250)
        for ns in self.names:
            r = subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", "eth0", "root", "tbf",
                                "rate", rate, "burst", str(burst), "latency", "20ms"],
                               capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                raise Skip(f"tc tbf is unavailable: {r.stderr.strip()}")
        self.shaping = f"tbf rate {rate} burst {burst} latency 20ms on each host's eth0"

    def command(self, host, args):
        return ["ip", "netns", "exec", self.names[host], *args]

    def cleanup(self):
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.created = []


def ip(ns, *args):
    run(["ip", "-n", ns, *args])


def parse_rate(rate):
    m = re.fullmatch(r"(\d+)([kmg]?)bit", rate)
    if not m:
        raise ValueError(f"rate {rate!r} is not like 10gbit")
    return int(m.group(1)) * {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[m.group(2)]


def parse_layout(s):
    h, l = s.split("x")
    return int(h), int(l)


def shm_of(job):
    try:
        return [f for f in os.listdir("/dev/shm") if job in f]
    except FileNotFoundError:
        return []


def remove_shm(job):
    for f in shm_of(job):
        try:
            os.unlink(os.path.join("/dev/shm", f))
        except OSError:
            pass


def start_ranks(nets, rank_program, hosts, local, args, job, **extra):
    """Starts hosts * local ranks (rank r on host r // local) running `rank_program args`."""
    token = os.urandom(16).hex()
    size = hosts * local
    j = Job()
    atexit.register(remove_shm, job)
    for r in range(size):
        h = r // local
        env = torchrun_env(r, size, nets.addrs[0], 29500, job, COHORT_TOKEN=token,
                           COHORT_HOST=f"nshost{h}", COHORT_SOCKET_IFNAME="eth0",
                           LOCAL_RANK=r % local, LOCAL_WORLD_SIZE=local, **extra)
        j.start(nets.command(h, [rank_program, *args]), env)
    return j


def case_suite(rank_program, layout, rate):
    hosts, local = parse_layout(layout)
    nets = Hosts(hosts, rate)
    job = f"nshier{os.getpid()}"
    try:
        start = time.monotonic()
        j = start_ranks(nets, rank_program, hosts, local, ["suite"], job)
        codes = j.wait_all(180)
        text = j.show()
        print(text)
        size = hosts * local
        assert codes == [0] * size, f"exit codes {codes}\n{text}"
        for r in range(size):
            assert f"rank {r}: suite passed" in text, f"rank {r} did not pass\n{text}"
        left = shm_of(job)
        assert not left, f"left in /dev/shm: {left}"
        print(f"{hosts} hosts x {local} ranks, {nets.shaping}: suite passed in "
              f"{time.monotonic() - start:.1f} s")
    finally:
        nets.cleanup()
        remove_shm(job)


def kill_case(rank_program, layout, rate, victims_of):
    hosts, local = parse_layout(layout)
    nets = Hosts(hosts, rate)
    job = f"nshierkill{os.getpid()}"
    try:
        size = hosts * local
        victims = victims_of(hosts, local)
        j = start_ranks(nets, rank_program, hosts, local, ["loop", "100000", str(1 << 20)], job)
        end = time.monotonic() + 90
        while not all("iter 3\n" in j.output(v) for v in victims):
            assert time.monotonic() < end, f"the loop did not get going\n{j.show()}"
            assert all(j.procs[v].poll() is None for v in victims), j.show()
            time.sleep(0.01)
        for v in victims:
            os.killpg(j.procs[v].pid, signal.SIGKILL)
        killed = time.monotonic()
        for r in range(size):
            if r not in victims:
                try:
                    j.procs[r].wait(timeout=max(0.1, killed + DEADLINE + 10 - time.monotonic()))
                except subprocess.TimeoutExpired:
                    j.kill_all()
                    raise AssertionError(f"rank {r} still running {DEADLINE + 10} s after the kill\n"
                                         f"{j.show()}")
        noticed = time.monotonic() - killed
        j.wait_all(10)
        text = j.show()
        print(text)
        for r in range(size):
            if r in victims:
                continue
            m = re.search(rf"rank {r}: error (\w+) peer=(-?\d+) after=(\d+)ms: (.*)", j.output(r))
            assert m, f"rank {r} did not report an error\n{text}"
            assert m.group(1) in ("peer_lost", "timed_out"), \
                f"rank {r} said {m.group(1)}, not peer_lost or timed_out\n{text}"
            assert j.procs[r].returncode == 3, text
        assert noticed < DEADLINE + 5, f"the survivors took {noticed:.1f} s to fail"
        left = shm_of(job)
        assert not left, f"left in /dev/shm: {left}"
        print(f"{hosts} hosts x {local} ranks, killed ranks {victims}: every survivor failed "
              f"within {noticed * 1000:.0f} ms of the kill; nothing left in /dev/shm")
    finally:
        nets.cleanup()
        remove_shm(job)


def case_kill_host(rank_program, layout, rate):
    kill_case(rank_program, layout, rate, lambda h, l: list(range((h - 1) * l, h * l)))


def case_kill_rank(rank_program, layout, rate):
    kill_case(rank_program, layout, rate, lambda h, l: [1])


def case_kill_rank0(rank_program, layout, rate):
    kill_case(rank_program, layout, rate, lambda h, l: [0])


def main():
    if len(sys.argv) < 5:
        print(__doc__, file=sys.stderr)
        return 2
    case = globals().get("case_" + sys.argv[1])
    if case is None:
        print(f"no case {sys.argv[1]!r}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, f: sys.exit(128 + s))  # runs atexit: namespaces, processes
    try:
        case(os.path.abspath(sys.argv[2]), sys.argv[3], sys.argv[4])
    except Skip as s:
        print(f"SKIP: {s}", file=sys.stderr)
        return 77
    except AssertionError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
