#!/usr/bin/env python3
"""Checks that cohort's layers point one way.

1. From the #include lines, transitively: a store never reaches into a transport, the shared
   net layer and the launcher reach neither, and core reaches nothing above it.
2. With the real compiler (-E -H, so every #if is decided as a user's build decides it): the
   headers a user of the umbrella, of shm, of the stores, or of tcp under
   COHORT_SEPARATE_COMPILATION includes pull in no Boost header, and the umbrella and shm pull
   in none of the standard headers that cost most to parse and that they do without
   (bench/results/compile_time.md).

Each failure names the include chain. Usage: check_layers.py INCLUDE_DIR -- CXX [ARGS...]
"""
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from include_graph import IncludeGraph  # noqa: E402

# (headers under this folder, or this header, may not reach headers under any of these)
RULES = [
    ("cohort/rendezvous/", ["cohort/transport/", "cohort/collectives/", "cohort/async"]),
    # The CUDA IPC all_reduce is reductions only; the codecs stay out of its path.
    ("cohort/cuda/ipc.hpp", ["cohort/compress/"]),
    ("cohort/cuda/detail/ipc_", ["cohort/compress/"]),
    ("cohort/training/", ["cohort/async", "cohort/transport/", "cohort/rendezvous/"]),
    # The parameter server runs over any communicator: it names no transport.
    ("cohort/parameter_server", ["cohort/async", "cohort/transport/", "cohort/rendezvous/",
                                 "cohort/collectives/"]),
    # What the host and the device must agree on, bit for bit, in headers nvcc reads: they
    # include nothing of cohort.
    ("cohort/core/detail/reduction_tags.hpp", ["cohort/"]),
    ("cohort/compress/detail/top_k_tuning.hpp", ["cohort/"]),
    ("cohort/detail/net/", ["cohort/rendezvous/", "cohort/transport/", "cohort/launch/"]),
    ("cohort/launch/", ["cohort/rendezvous/", "cohort/transport/", "cohort/collectives/"]),
    ("cohort/core/", ["cohort/collectives/", "cohort/transport/", "cohort/rendezvous/",
                      "cohort/compress/", "cohort/async", "cohort/launch/"]),
]

# (header, extra flags): what a user includes that must not bring Boost along
BOOST_FREE = [
    ("cohort/cohort.hpp", []),
    ("cohort/transport/shm.hpp", []),
    ("cohort/training/local_sgd.hpp", []),
    ("cohort/parameter_server.hpp", []),
    ("cohort/rendezvous/tcp_store.hpp", []),
    ("cohort/rendezvous/file_store.hpp", []),
    ("cohort/transport/tcp.hpp", ["-DCOHORT_SEPARATE_COMPILATION"]),
]

# (header, standard headers it must not pull in): the collectives and the in-process and
# shared-memory transports parse without them (`<functional>` comes with shm's launcher
# support, whose `getenv_function` is a `std::function`).
LEAN = [
    ("cohort/cohort.hpp", ["algorithm", "functional", "ranges"]),
    ("cohort/transport/shm.hpp", ["algorithm", "ranges"]),
]


def check_rules(root):
    graph = IncludeGraph(root)
    problems = []
    for folder, banned in RULES:
        # a folder ("x/"), a header ("x.hpp") or the headers whose path starts so ("x/ipc_")
        paths = sorted(p for p in root.rglob("*.hpp")
                       if p.relative_to(root).as_posix().startswith(folder))
        if not paths:
            problems.append("rule for %s matches no header" % folder)
        for path in paths:
            rel = path.relative_to(root).as_posix()
            chain = graph.chain_to(rel, lambda h: any(h.startswith(b) for b in banned))
            if chain:
                problems.append("%s reaches %s: %s" % (folder, chain[-1], " -> ".join(chain)))
    return problems


def is_boost(path):
    return "/boost/" in path or path.startswith("boost/")


def first_chain(cxx, root, header, flags, wanted):
    """The include chain to the first header `header` pulls in for which `wanted(path)` holds,
    from the compiler's -H; None when there is none."""
    proc = subprocess.run(cxx + ["-std=c++20", "-I", str(root)] + flags +
                          ["-E", "-H", "-x", "c++", "-o", "/dev/null", "-"],
                          input="#include <%s>\n" % header, text=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        return ["(it does not even preprocess: %s)" % proc.stderr.strip()[-2000:]]
    stack = []
    for line in proc.stderr.splitlines():
        dots, _, path = line.partition(" ")
        if not dots or set(dots) != {"."}:
            continue
        depth = len(dots)
        del stack[depth - 1:]
        try:  # cohort's own headers relative to the include directory, the rest as found
            path = pathlib.Path(path).resolve().relative_to(root).as_posix()
        except ValueError:
            pass
        stack.append(path)
        if wanted(path):
            return stack
    return None


def main():
    args = sys.argv[1:]
    root = pathlib.Path(args[0]).resolve()
    cxx = args[args.index("--") + 1:]
    problems = check_rules(root)
    for header, flags in BOOST_FREE:
        chain = first_chain(cxx, root, header, flags, is_boost)
        if chain:
            problems.append("%s%s pulls in Boost: %s" % (
                header, (" with " + " ".join(flags)) if flags else "",
                " -> ".join(chain)))
    for header, banned in LEAN:
        chain = first_chain(cxx, root, header, [],
                            lambda path: any(path.endswith("/" + b) for b in banned))
        if chain:
            problems.append("%s pulls in <%s>, which it does without: %s" % (
                header, chain[-1].rsplit("/", 1)[-1], " -> ".join(chain)))
    for p in problems:
        print("FAIL " + p)
    if not problems:
        print("layers point one way: %d rules hold; %d headers parse no Boost header; %d parse "
              "none of the standard headers they do without" %
              (len(RULES), len(BOOST_FREE), len(LEAN)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
