#!/usr/bin/env python3
"""Prints the public headers under include/ for the per-header compile check, one per line,
relative to include/ (for meson).

  list_headers.py INCLUDE_DIR            every header
  list_headers.py INCLUDE_DIR --boost    only those that reach a Boost header (transitively)
  list_headers.py INCLUDE_DIR --plain    only those that do not
  ... --outer / --detail                 and of those, only the ones outside (in) a detail/ folder

cohort/impl/ is left out: its one header compiles only under COHORT_SEPARATE_COMPILATION and
has a test of its own (separate_main.cpp, with examples/common/tcp_src.cpp).
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from include_graph import IncludeGraph  # noqa: E402

root = pathlib.Path(sys.argv[1])
mode = sys.argv[2] if len(sys.argv) > 2 else "--all"
part = sys.argv[3] if len(sys.argv) > 3 else "--any"
graph = IncludeGraph(root)
for path in sorted(root.rglob("*.hpp")):
    rel = path.relative_to(root).as_posix()
    if rel.startswith("cohort/impl/"):
        continue
    if part != "--any" and (part == "--detail") != ("/detail/" in rel):
        continue
    boost = graph.chain_to(rel, lambda h: h.startswith("boost/")) is not None
    if mode == "--all" or (mode == "--boost") == boost:
        print(rel)
