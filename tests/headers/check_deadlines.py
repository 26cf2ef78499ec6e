#!/usr/bin/env python3
"""Checks that no header forms a deadline as `now() + d`.

`steady_clock::now() + d` overflows into the past when d is near its type's maximum (a user's
`milliseconds::max()` timeout is one), so a wait that should be unbounded fails at once. Every
deadline goes through `cohort::deadline_after(d)` or `cohort::later(from, d)`, which saturate
(core/options.hpp). Each failure names the file and line. Usage: check_deadlines.py INCLUDE_DIR
"""
import pathlib
import re
import sys

NOW_PLUS = re.compile(r"now\(\)\s*\+")


def main():
    root = pathlib.Path(sys.argv[1])
    headers = sorted(p for p in root.rglob("*") if p.suffix in (".hpp", ".cuh", ".h"))
    bad = []
    for path in headers:
        text = path.read_text()
        for m in NOW_PLUS.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            bad.append(f"{path.relative_to(root)}:{line}: a deadline formed as now() + d; "
                       "use deadline_after(d) or later(from, d), which saturate")
    for b in bad:
        print(b)
    print(f"{len(headers)} headers checked, {len(bad)} deadlines formed as now() + d")
    return 1 if bad or not headers else 0


if __name__ == "__main__":
    sys.exit(main())
