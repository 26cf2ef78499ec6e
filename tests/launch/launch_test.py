#!/usr/bin/env python3
"""Process tests of cohort-run, and of launch_info under a real mpirun.

usage: launch_test.py CASE COHORT_RUN LAUNCH_PROBE
       launch_test.py mpirun LAUNCH_PROBE

Every wait is bounded. Exit status: 0 pass, 1 fail, 77 skipped (meson's convention).
"""

import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

LIMIT = 60  # seconds any one command may take before the test fails
PROMPT = 20  # "promptly": the sleeping ranks sleep 60 s, so this is well under their sleep
LINE = re.compile(r"^rank=(\d+) size=(\d+) local_rank=(\d+) local_size=(\d+) "
                  r"source=(\S+) job=(\S+) pid=(\d+) master=(\S*):(\d+)$")
LAUNCHER_VARS = re.compile(r"^(COHORT_|RANK$|WORLD_SIZE$|LOCAL_RANK$|LOCAL_WORLD_SIZE$|MASTER_|"
                           r"TORCHELASTIC_|OMPI_|PMI_|PMIX_|MPI_LOCAL|SLURM_)")


def clean_env():
    """This environment without any launcher's variables, so that outer launchers do not leak."""
    return {k: v for k, v in os.environ.items() if not LAUNCHER_VARS.match(k)}


def run(args, env=None):
    start = time.monotonic()
    result = subprocess.run(args, capture_output=True, text=True, timeout=LIMIT,
                            env=clean_env() if env is None else env)
    result.elapsed = time.monotonic() - start
    return result


def show(result):
    return (f"\n--- exit {result.returncode} after {result.elapsed:.1f} s\n"
            f"--- stdout\n{result.stdout}--- stderr\n{result.stderr}")


def probe_lines(stdout, prefixed=True):
    """The parsed probe lines: {rank: dict}; with `prefixed`, each line's "[r] " must match."""
    found = {}
    for line in stdout.splitlines():
        prefix = None
        if prefixed:
            m = re.match(r"^\[(\d+)\] (.*)$", line)
            assert m, f"line without a rank prefix: {line!r}"
            prefix, line = int(m.group(1)), m.group(2)
        m = LINE.match(line)
        if not m:
            continue
        info = dict(zip(["rank", "size", "local_rank", "local_size", "source", "job", "pid",
                         "master_addr", "master_port"], m.groups()))
        for key in ["rank", "size", "local_rank", "local_size", "pid", "master_port"]:
            info[key] = int(info[key])
        assert prefix is None or prefix == info["rank"], f"prefix {prefix} on rank {info['rank']}"
        assert info["rank"] not in found, f"rank {info['rank']} reported twice"
        found[info["rank"]] = info
    return found


def leftovers(job_id):
    """Processes still alive that carry COHORT_JOB_ID=job_id: ranks cohort-run failed to end."""
    alive = []
    marker = f"COHORT_JOB_ID={job_id}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    alive.append(int(pid))
        except OSError:
            pass
    return alive


def assert_no_leftovers(job_id):
    deadline = time.monotonic() + 5  # a process that got SIGKILL takes a moment to go
    while leftovers(job_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not leftovers(job_id), f"ranks of job {job_id} outlived cohort-run: {leftovers(job_id)}"


def new_job_id():
    return "test-" + uuid.uuid4().hex[:12]


def run_misbehaving(cohort_run, options, probe, probe_args, n=3):
    """Runs n probes that meet at a barrier before any misbehaves; checks that all started
    and that none outlived cohort-run."""
    job = new_job_id()
    with tempfile.TemporaryDirectory() as barrier:
        r = run([cohort_run, "-n", str(n), "--job-id", job] + options +
                [probe, "--barrier", barrier] + probe_args)
    assert sorted(probe_lines(r.stdout)) == list(range(n)), show(r)
    assert_no_leftovers(job)
    return r


def case_ranks(cohort_run, probe):
    """All ranks start with distinct ranks, one size and one job id; output is prefixed."""
    n = 4
    r = run([cohort_run, "-n", str(n), probe, "--stderr", "--partial", "no newline"])
    assert r.returncode == 0, show(r)
    lines = probe_lines(r.stdout)
    assert sorted(lines) == list(range(n)), show(r)
    jobs = {info["job"] for info in lines.values()}
    assert len(jobs) == 1, jobs
    for rank, info in lines.items():
        assert info["size"] == n and info["local_size"] == n, info
        assert info["local_rank"] == rank, info
        assert info["source"] == "cohort-run", info
        assert info["master_addr"] == "127.0.0.1" and 0 < info["master_port"] < 65536, info
        assert f"[{rank}] no newline\n" in r.stdout, show(r)  # a partial last line is flushed
        assert f"[{rank}] stderr line from rank {rank}\n" in r.stderr, show(r)
    assert all(line.startswith("[") for line in r.stderr.splitlines()), show(r)
    # Another run is another job; --job-id and a MASTER_PORT that is set are passed on.
    again = run([cohort_run, "-n", "2", probe])
    assert again.returncode == 0, show(again)
    assert {i["job"] for i in probe_lines(again.stdout).values()}.isdisjoint(jobs), show(again)
    given = run([cohort_run, "-n", "2", "--job-id", "given.1", probe],
                env=dict(clean_env(), MASTER_PORT="40123"))
    assert given.returncode == 0, show(given)
    lines = probe_lines(given.stdout)
    assert [i["job"] for i in lines.values()] == ["given.1"] * 2, show(given)
    assert [i["master_port"] for i in lines.values()] == [40123] * 2, show(given)


def case_arguments(cohort_run, probe):
    """Arguments after the program, options included, reach it unchanged; PATH is searched."""
    r = run([cohort_run, "-n", "1", probe, "--echo", "a b", "--echo", "--timeout", "--echo", "-n"])
    assert r.returncode == 0, show(r)
    assert "[0] echo=a b\n[0] echo=--timeout\n[0] echo=-n\n" in r.stdout, show(r)
    r = run([cohort_run, "--nproc=2", "--", probe, "--echo", "--"])
    assert r.returncode == 0 and r.stdout.count("echo=--\n") == 2, show(r)
    env = dict(clean_env(), PATH=os.path.dirname(os.path.abspath(probe)) + ":" +
               os.environ.get("PATH", ""))
    r = run([cohort_run, "-n", "2", os.path.basename(probe)], env=env)
    assert r.returncode == 0 and len(probe_lines(r.stdout)) == 2, show(r)


def case_failure(cohort_run, probe):
    """A failing rank ends the job with its status; the sleeping ranks are ended promptly."""
    r = run_misbehaving(cohort_run, [], probe, ["--fail-rank", "1", "--code", "3", "--sleep", "60"])
    assert r.returncode == 3, show(r)
    assert r.elapsed < PROMPT, show(r)
    assert "cohort-run: rank 1 exited with status 3" in r.stderr, show(r)


def case_signal(cohort_run, probe):
    """A rank killed by a signal is reported by name; cohort-run exits 128 + the signal."""
    r = run_misbehaving(cohort_run, [], probe, ["--signal-rank", "2", "--signal",
                                                str(int(signal.SIGKILL)), "--sleep", "60"])
    assert r.returncode == 128 + signal.SIGKILL, show(r)
    assert r.elapsed < PROMPT, show(r)
    assert "cohort-run: rank 2 killed by signal SIGKILL" in r.stderr, show(r)


def case_grace(cohort_run, probe):
    """Ranks that ignore SIGTERM get SIGKILL after the grace period."""
    r = run_misbehaving(cohort_run, ["--grace", "1"], probe,
                        ["--ignore-term", "--fail-rank", "0", "--code", "5", "--sleep", "60"])
    assert r.returncode == 5, show(r)
    assert 0.9 < r.elapsed < PROMPT, show(r)


def case_timeout(cohort_run, probe):
    """--timeout ends every rank after the limit and exits 124."""
    job = new_job_id()
    r = run([cohort_run, "-n", "2", "--timeout", "1", "--job-id", job, probe, "--sleep", "60"])
    assert r.returncode == 124, show(r)
    assert 0.9 < r.elapsed < PROMPT, show(r)
    assert "timed out after 1 s" in r.stderr, show(r)
    assert_no_leftovers(job)
    fast = run([cohort_run, "-n", "2", "--timeout", "30", probe])
    assert fast.returncode == 0 and fast.elapsed < PROMPT, show(fast)


def read_lines(proc, count, deadline):
    """Reads stdout of `proc` until it holds `count` lines or the deadline passes."""
    text = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while text.count(b"\n") < count and time.monotonic() < deadline:
            if sel.select(timeout=max(0, deadline - time.monotonic())):
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                text += chunk
    return text.decode()


def case_sigterm(cohort_run, probe):
    """SIGTERM or SIGINT to cohort-run reaches the ranks and ends them; exit 128 + signal."""
    for sig in [signal.SIGTERM, signal.SIGINT]:
        job = new_job_id()
        proc = subprocess.Popen([cohort_run, "-n", "3", "--job-id", job, probe, "--sleep", "60"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
        try:
            seen = read_lines(proc, 3, time.monotonic() + LIMIT)
            assert len(probe_lines(seen)) == 3, seen
            start = time.monotonic()
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=PROMPT)
            assert proc.returncode == 128 + sig, (proc.returncode, err)
            assert time.monotonic() - start < PROMPT
            assert f"got {sig.name}" in err.decode(), err
            assert_no_leftovers(job)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=LIMIT)


def case_missing(cohort_run, probe):
    """A program that cannot be found exits 127 with a clear message, by path or in PATH."""
    for program in ["/nonexistent/cohort-probe", "cohort-no-such-program-xyz"]:
        r = run([cohort_run, "-n", "2", program, "arg"])
        assert r.returncode == 127, show(r)
        assert f"cohort-run: cannot run '{program}'" in r.stderr, show(r)
        assert r.stderr.count("cannot run") == 1 and "exited with" not in r.stderr, show(r)
    r = run([cohort_run, "-n", "1", "/dev/null"])  # exists but cannot be executed
    assert r.returncode == 126, show(r)


def case_usage(cohort_run, probe):
    """Bad arguments give the usage text and exit 2; --help exits 0."""
    bad = [[], ["-n"], [probe], ["-n", "2"], ["-n", "0", probe], ["-n", "x", probe],
           ["-n", "4097", probe], ["--bogus", "-n", "2", probe], ["-n", "2", "--timeout", "-1", probe],
           ["-n", "2", "--timeout", "abc", probe], ["-n", "2", "--job-id", "a/b", probe],
           ["-n", "2", "--job-id", "", probe]]
    for args in bad:
        r = run([cohort_run] + args)
        assert r.returncode == 2, f"{args}: {show(r)}"
        assert "usage: cohort-run -n N" in r.stderr and r.stderr.startswith("cohort-run: "), show(r)
        assert r.stdout == "", show(r)
    r = run([cohort_run, "--help"])
    assert r.returncode == 0 and r.stdout.startswith("usage: cohort-run"), show(r)


def case_mpirun(probe):
    """launch_probe under the real mpirun: ranks 0..2, one size, one job id per run."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        print("SKIP: mpirun is not in PATH", file=sys.stderr)
        return 77
    version = run([mpirun, "--version"])
    text = version.stdout + version.stderr
    if "Open MPI" in text or "OpenRTE" in text:
        command, source = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "3"], "open-mpi"
    elif "HYDRA" in text:
        command, source = [mpirun, "-np", "3"], "pmi"
    else:
        print(f"SKIP: {mpirun} is neither Open MPI nor MPICH:\n{text}", file=sys.stderr)
        return 77
    jobs = []
    for _ in range(2):
        r = run(command + [probe])
        assert r.returncode == 0, show(r)
        lines = probe_lines(r.stdout, prefixed=False)
        assert sorted(lines) == [0, 1, 2], show(r)
        for rank, info in lines.items():
            assert (info["size"], info["local_rank"], info["local_size"]) == (3, rank, 3), info
            assert info["source"] == source, info
        job = {info["job"] for info in lines.values()}
        assert len(job) == 1, job
        jobs += job
        print(f"mpirun job id: {jobs[-1]}")
    assert jobs[0] != jobs[1], f"two mpirun jobs share the id {jobs[0]}"
    return 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "mpirun":
        return case_mpirun(os.path.abspath(sys.argv[2]))
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    case = globals().get("case_" + sys.argv[1])
    if case is None:
        print(f"no case {sys.argv[1]!r}", file=sys.stderr)
        return 2
    case(os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
