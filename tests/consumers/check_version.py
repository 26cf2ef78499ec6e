#!/usr/bin/env python3
"""Checks that every place stating cohort's version agrees with Meson's project version.

usage: check_version.py SOURCE_ROOT VERSION
"""
import json
import pathlib
import re
import sys


def main():
    root, version = pathlib.Path(sys.argv[1]), sys.argv[2]
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        print(f"Meson's project version {version!r} is not MAJOR.MINOR.PATCH "
              "(docs/VERSIONING.md)", file=sys.stderr)
        return 1
    major, minor, patch = version.split(".")
    problems = []

    def read(relative):
        path = root / relative
        if not path.exists():
            problems.append(f"{relative} is missing")
            return ""
        return path.read_text()

    header = read("include/cohort/version.hpp")
    wanted = {"COHORT_VERSION_MAJOR": major, "COHORT_VERSION_MINOR": minor,
              "COHORT_VERSION_PATCH": patch, "COHORT_VERSION_STRING": f'"{version}"'}
    for macro, value in wanted.items():
        found = re.search(rf"^#define {macro} (\S+)\s*$", header, re.MULTILINE)
        if not found or found.group(1) != value:
            got = found.group(1) if found else "nothing"
            problems.append(f"include/cohort/version.hpp: {macro} is {got}, expected {value}")

    changelog = read("CHANGELOG.md")
    heading = rf"^## (\[{re.escape(version)}\]|{re.escape(version)})(\s|$)"
    if not re.search(heading, changelog, re.MULTILINE):
        problems.append(f"CHANGELOG.md has no '## [{version}]' section")

    conanfile = read("conanfile.py")
    found = re.search(r'^\s*version = "([^"]+)"', conanfile, re.MULTILINE)
    if not found or found.group(1) != version:
        problems.append(f"conanfile.py: version is {found.group(1) if found else 'missing'}")

    port = json.loads(read("ports/cohort/vcpkg.json") or "{}")
    if port.get("version") != version:
        problems.append(f"ports/cohort/vcpkg.json: version is {port.get('version')}")

    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"(Meson's project version is {version}; change them together)", file=sys.stderr)
        return 1
    print(f"version {version}: version.hpp, CHANGELOG.md, conanfile.py, vcpkg.json agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
