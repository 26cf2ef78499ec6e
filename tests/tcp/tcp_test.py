#!/usr/bin/env python3
"""Process tests of the TCP transport: ranks as processes on loopback, across network
namespaces (real interfaces, optionally lossy), under mpirun, with a rank killed mid-collective,
and with a rank that never arrives.

usage: tcp_test.py CASE TCP_RANK [ARG]
  loopback P        P ranks on 127.0.0.1 with torchrun's variables; the collective suite
  kill              3 ranks in an all_reduce loop; SIGKILL rank 1; the others must say peer_lost
  missing           ranks 0 and 2 of 3; both must say timed_out naming rank 1
  mpirun            3 ranks under Open MPI's mpirun (MASTER_ADDR/PORT passed with -x)
  cohort_run PATH   3 ranks under cohort-run (COHORT_* variables, MASTER_ADDR/PORT it chooses)
  netns P           P ranks, each in its own network namespace on a bridge (IPv4)
  netns6 P          the same over IPv6 only
  lossy P           netns with 1 ms delay and 1% loss (tc netem; nftables loss where netem is absent)

Every wait is bounded; namespaces are removed on every path. Only loopback and namespaces this
test created carry traffic. Exit status: 0 pass, 1 fail, 77 skipped (meson's convention).
"""

import atexit
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

LIMIT = 120  # seconds a whole job may take
LAUNCHER_VARS = re.compile(r"^(COHORT_|RANK$|WORLD_SIZE$|LOCAL_RANK$|LOCAL_WORLD_SIZE$|MASTER_|"
                           r"TORCHELASTIC_|OMPI_|PMI_|PMIX_|MPI_LOCAL|SLURM_)")


class Skip(Exception):
    pass


def clean_env():
    return {k: v for k, v in os.environ.items() if not LAUNCHER_VARS.match(k)}


_held = []  # the sockets that hold the ports free_port() gave out


def free_port():
    """A port on 127.0.0.1 for a job's store, held until this script ends: a socket bound to it
    with SO_REUSEADDR, never listening, keeps the kernel from giving it to another connection or
    bind, while the store (which sets SO_REUSEADDR too) still binds it (tests/ports.hpp)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    _held.append(s)
    return s.getsockname()[1]


def torchrun_env(rank, size, addr, port, job, **extra):
    env = clean_env()
    env.update({"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(size), "MASTER_ADDR": addr, "MASTER_PORT": str(port),
                "TORCHELASTIC_RUN_ID": job, "COHORT_TEST_TIMEOUT_MS": "30000"})
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Job:
    """Processes started together, each in its own process group, all ended on exit."""

    def __init__(self):
        self.procs = []
        self.outputs = []
        atexit.register(self.kill_all)

    def start(self, args, env):
        out = tempfile.TemporaryFile(mode="w+")
        p = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)
        self.outputs.append(out)
        return p

    def output(self, i):
        f = self.outputs[i]
        f.flush()
        f.seek(0)
        return f.read()

    def wait_all(self, limit=LIMIT):
        end = time.monotonic() + limit
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill_all()
                raise AssertionError(f"job took more than {limit} s\n{self.show()}")
        return [p.returncode for p in self.procs]

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()

    def show(self):
        return "".join(f"--- process {i} (exit {p.returncode})\n{self.output(i)}"
                       for i, p in enumerate(self.procs))


def expect_suite(job, size):
    codes = job.wait_all()
    text = job.show()
    assert codes == [0] * size, f"exit codes {codes}\n{text}"
    for r in range(size):
        assert f"rank {r}: suite passed" in text, f"rank {r} did not pass\n{text}"
    print(text)


def case_loopback(tcp_rank, p):
    size = int(p)
    port, job = free_port(), f"loopback{os.getpid()}"
    j = Job()
    for r in range(size):
        j.start([tcp_rank, "suite"], torchrun_env(r, size, "127.0.0.1", port, job))
    expect_suite(j, size)


def case_kill(tcp_rank, _):
    size, victim = 3, 1
    port, job = free_port(), f"kill{os.getpid()}"
    j = Job()
    for r in range(size):
        j.start([tcp_rank, "loop", "100000", str(1 << 20)],
                torchrun_env(r, size, "127.0.0.1", port, job, COHORT_TEST_TIMEOUT_MS=20000))
    end = time.monotonic() + 60
    while "iter 3\n" not in j.output(victim):
        assert time.monotonic() < end and j.procs[victim].poll() is None, j.show()
        time.sleep(0.01)
    os.killpg(j.procs[victim].pid, signal.SIGKILL)
    killed = time.monotonic()
    for r in range(size):
        if r != victim:
            j.procs[r].wait(timeout=30)
    noticed = time.monotonic() - killed
    j.wait_all(10)
    text = j.show()
    print(text)
    for r in range(size):
        if r == victim:
            continue
        m = re.search(rf"rank {r}: error (\w+) peer=(-?\d+) after=(\d+)ms: (.*)", j.output(r))
        assert m, f"rank {r} did not report an error\n{text}"
        assert m.group(1) == "peer_lost", f"rank {r} said {m.group(1)}, not peer_lost\n{text}"
        assert j.procs[r].returncode == 3, text
    # The deadline of each call is 20 s: the survivors must know long before it.
    assert noticed < 5, f"the survivors took {noticed:.1f} s to notice"
    print(f"survivors reported peer_lost {noticed * 1000:.0f} ms after the kill")


def case_missing(tcp_rank, _):
    port, job = free_port(), f"missing{os.getpid()}"
    # Rank 0 hosts the store and waits longer than rank 2, so that rank 2 meets the store
    # however late its process starts (a sanitized build under load has started it seconds
    # late). Rank 2 gives up at its deadline and says so in the store, which ends rank 0's
    # wait too: each names the rank that never came, not the store that left.
    timeouts = {0: 10, 2: 1.5}
    j = Job()
    for r in (0, 2):
        j.start([tcp_rank, "setup"],
                torchrun_env(r, 3, "127.0.0.1", port, job, COHORT_CONNECT_TIMEOUT=timeouts[r]))
    j.wait_all(30)
    text = j.show()
    print(text)
    for i, r in enumerate((0, 2)):
        assert re.search(rf"rank {r}: error timed_out peer=1 .*rank 1 never arrived", j.output(i)), text
    assert "when rank 2 gave up waiting" in j.output(0), text


def case_mpirun(tcp_rank, _):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise Skip("mpirun is not in PATH (Debian: openmpi-bin)")
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
    if "Open MPI" not in version.stdout + version.stderr:
        raise Skip(f"{mpirun} is not Open MPI")
    port = free_port()
    j = Job()
    j.start([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "3",
             "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={port}", tcp_rank, "suite", "quick"],
            clean_env())
    codes = j.wait_all()
    text = j.show()
    print(text)
    assert codes == [0], text
    for r in range(3):
        assert f"rank {r}: suite passed" in text, text


def case_cohort_run(tcp_rank, cohort_run):
    j = Job()
    j.start([cohort_run, "-n", "3", "--timeout", "100", tcp_rank, "suite", "quick"], clean_env())
    codes = j.wait_all()
    text = j.show()
    print(text)
    assert codes == [0], text
    for r in range(3):
        assert f"rank {r}: suite passed" in text, text


class Namespaces:
    """A switch namespace with a bridge, and one namespace per rank joined to it by a veth pair.
    Everything is removed by cleanup(), which runs on every path (atexit and signals)."""

    def __init__(self, size, ipv4=True, ipv6=False):
        if os.geteuid() != 0:
            raise Skip("network namespaces need root")
        if shutil.which("ip") is None:
            raise Skip("iproute2's ip is not installed")
        tag = f"cht{os.getpid()}"
        self.switch = f"{tag}s"
        self.ranks = [f"{tag}r{i}" for i in range(size)]
        self.created = []
        atexit.register(self.cleanup)
        probe = subprocess.run(["ip", "netns", "add", self.switch], capture_output=True, text=True)
        if probe.returncode != 0:
            raise Skip(f"cannot create a network namespace: {probe.stderr.strip()}")
        self.created.append(self.switch)
        self.ip(self.switch, "link", "set", "lo", "up")
        self.ip(self.switch, "link", "add", "br0", "type", "bridge")
        self.ip(self.switch, "link", "set", "br0", "up")
        self.v4 = [f"10.99.0.{i + 1}" for i in range(size)]
        self.v6 = [f"fd99::{i + 1}" for i in range(size)]
        for i, ns in enumerate(self.ranks):
            run(["ip", "netns", "add", ns])
            self.created.append(ns)
            self.ip(ns, "link", "set", "lo", "up")
            self.ip(self.switch, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            self.ip(self.switch, "link", "set", f"p{i}", "master", "br0")
            self.ip(self.switch, "link", "set", f"p{i}", "up")
            if ipv4:
                self.ip(ns, "addr", "add", f"{self.v4[i]}/24", "dev", "eth0")
            if ipv6:
                self.ip(ns, "-6", "addr", "add", f"{self.v6[i]}/64", "dev", "eth0", "nodad")
            self.ip(ns, "link", "set", "eth0", "up")

    @staticmethod
    def ip(ns, *args):
        run(["ip", "-n", ns, *args])

    def impair(self):
        """1 ms delay and 1% loss on every rank's interface; returns what was applied."""
        netem = subprocess.run(["tc", "-n", self.ranks[0], "qdisc", "add", "dev", "eth0", "root", "netem",
                                "delay", "1ms", "loss", "1%"], capture_output=True, text=True)
        if netem.returncode == 0:
            for ns in self.ranks[1:]:
                run(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "1ms", "loss", "1%"])
            return "tc netem delay 1ms loss 1%"
        if shutil.which("nft") is None:
            raise Skip(f"tc netem is unavailable ({netem.stderr.strip()}) and nft (nftables) is not installed")
        print(f"note: tc netem is unavailable in this kernel ({netem.stderr.strip()}); "
              "emulating 1% loss with nftables, without the 1 ms delay", file=sys.stderr)
        rules = ("table inet cohort_loss {\n  chain out {\n"
                 "    type filter hook output priority 0; policy accept;\n"
                 "    meta l4proto tcp numgen random mod 100 < 1 counter drop\n  }\n}\n")
        for ns in self.ranks:
            run(["ip", "netns", "exec", ns, "nft", "-f", "-"], stdin=rules)
        return "nftables: 1% of TCP packets dropped at every rank (no delay: netem is unavailable)"

    def dropped(self):
        """Packets the nftables rules dropped so far (None under netem)."""
        total = None
        for ns in self.ranks:
            r = subprocess.run(["ip", "netns", "exec", ns, "nft", "list", "table", "inet", "cohort_loss"],
                               capture_output=True, text=True, timeout=30)
            m = re.search(r"counter packets (\d+)", r.stdout)
            if m:
                total = (total or 0) + int(m.group(1))
        return total

    def command(self, rank, args):
        return ["ip", "netns", "exec", self.ranks[rank], *args]

    def cleanup(self):
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.created = []


def run(args, stdin=None):
    r = subprocess.run(args, capture_output=True, text=True, timeout=30, input=stdin)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed: {r.stderr.strip()}")
    return r


def netns_job(tcp_rank, size, ipv6=False, lossy=False, mode=("suite", "quick"), **extra):
    nets = Namespaces(size, ipv4=not ipv6, ipv6=ipv6)
    try:
        applied = nets.impair() if lossy else "none"
        master = nets.v6[0] if ipv6 else nets.v4[0]
        # Each namespace is a host of its own: a job across hosts needs its token.
        token = os.urandom(16).hex()
        j = Job()
        start = time.monotonic()
        for r in range(size):
            # Without COHORT_SOCKET_IFNAME the transport must find eth0 by itself: the
            # namespaces have no default route.
            env = torchrun_env(r, size, master, 29500, f"netns{os.getpid()}", COHORT_TOKEN=token, **extra)
            j.start(nets.command(r, [tcp_rank, *mode]), env)
        codes = j.wait_all()
        text = j.show()
        print(text)
        assert codes == [0] * size, f"exit codes {codes}\n{text}"
        for r in range(size):
            assert f"rank {r}: suite passed" in text, text
        print(f"{size} ranks in {size} namespaces, IPv{6 if ipv6 else 4}, impairment: {applied}, "
              f"{time.monotonic() - start:.1f} s")
        if lossy and (dropped := nets.dropped()) is not None:
            print(f"nftables dropped {dropped} TCP packets on the way")
            assert dropped > 0, "the loss rule dropped nothing: the test did not test loss"
    finally:
        nets.cleanup()


def case_netns(tcp_rank, p):
    netns_job(tcp_rank, int(p))


def case_netns6(tcp_rank, p):
    netns_job(tcp_rank, int(p), ipv6=True, COHORT_SOCKET_IFNAME="=eth0")


def case_lossy(tcp_rank, p):
    netns_job(tcp_rank, int(p), lossy=True)


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    case = globals().get("case_" + sys.argv[1])
    if case is None:
        print(f"no case {sys.argv[1]!r}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, f: sys.exit(128 + s))  # runs atexit: namespaces, processes
    try:
        case(os.path.abspath(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else None)
    except Skip as s:
        print(f"SKIP: {s}", file=sys.stderr)
        return 77
    except AssertionError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
