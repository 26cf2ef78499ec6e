#!/usr/bin/env python3
"""Prints every public header under include/, relative to it, one per line (for meson)."""
import pathlib
import sys

root = pathlib.Path(sys.argv[1])
for path in sorted(root.rglob("*.hpp")):
    print(path.relative_to(root).as_posix())
