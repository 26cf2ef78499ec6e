#!/usr/bin/env python3
"""Compiles a file that must be rejected and checks the diagnostic names the concept.

usage: check.py SOURCE INCLUDE_DIR EXPECTED_TEXT... -- COMPILER [ARGS...]
"""
import subprocess
import sys

sep = sys.argv.index("--")
source, include, *expected = sys.argv[1:sep]
compiler = sys.argv[sep + 1:]
cmd = compiler + ["-std=c++20", "-fsyntax-only", "-I", include, source]
result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
if result.returncode == 0:
    sys.exit(f"{source} compiled, but must be rejected")
missing = [e for e in expected if e not in result.stderr]
if missing:
    sys.stderr.write(result.stderr[-4000:])
    sys.exit(f"the diagnostic does not mention {missing}")
print(f"{source} rejected; the diagnostic names {expected}")
