#!/usr/bin/env python3
"""Where broadcast's binomial tree stops paying: the tree against the pipelined chain.

Needs two builds of cohort-bench, one that always runs the tree and one that always runs the
chain, made with the compile definition that forces the schedule (cohort/collectives/detail/
tuning.hpp):

    meson setup build-tree  --buildtype=release -Dcpp_args=-DCOHORT_BROADCAST_SCHEDULE=1
    meson setup build-chain --buildtype=release -Dcpp_args=-DCOHORT_BROADCAST_SCHEDULE=2
    ninja -C build-tree bench/collectives/cohort-bench
    ninja -C build-chain bench/collectives/cohort-bench tools/cohort-run
    bench/collectives/tree_or_chain.py --tree build-tree --chain build-chain --ranks 3,4,8

Runs the two through compare_builds.py (interleaved rounds, median over rounds of each one's
p50) and prints tree / chain per size. Where it stays under 1 is where broadcast should run
the tree (`tuning::tree_broadcast_bytes` and the rule beside it). Stdlib only; exit status 1
when a run failed its checks.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_builds  # noqa: E402


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", required=True, help="build whose broadcast always runs the tree")
    p.add_argument("--chain", required=True, help="build whose broadcast always runs the chain")
    p.add_argument("--ranks", default="3,4", help="rank counts, e.g. 3,4,8")
    p.add_argument("--sizes", default="4,256,1K,4K,8K,16K,32K,64K,256K,1M")
    a, rest = p.parse_known_args(argv)
    return compare_builds.main(["--op", "broadcast", "--a", a.chain, "--b", a.tree,
                                "--labels", "chain,tree", "--ranks", a.ranks,
                                "--sizes", a.sizes] + rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
