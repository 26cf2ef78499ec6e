#!/usr/bin/env python3
"""Builds and runs consumer.cpp the way a user of one packaging route would, against this tree.

usage: consume.py ROUTE --source DIR --build DIR --version X.Y.Z -- CXX [ARGS...]

Routes:
  cmake             `meson install --destdir` this build, then find_package(cohort CONFIG)
  pkg-config        `meson install --destdir` this build, then g++ $(pkg-config --cflags --libs)
  meson-subproject  a Meson project whose subprojects/cohort is this source tree
  conan             `conan create` with an offline profile (skipped without Conan 2)
  vcpkg             `vcpkg install` of ports/cohort with a stub boost-asio (skipped without vcpkg)

Each route works in its own temporary directory, removed at the end (kept if
COHORT_KEEP_CONSUMER_TMP is set). Exit status: 0 pass, 1 fail, 77 skip (reason on stderr).
"""
import argparse
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

SKIP = 77
HERE = pathlib.Path(__file__).resolve().parent
CONSUMER_CPP = HERE / "consumer.cpp"


class Failure(Exception):
    pass


class Skip(Exception):
    pass


def run(cmd, cwd=None, env=None):
    """Runs cmd, echoing it; returns its stdout+stderr; raises Failure on a non-zero exit."""
    cmd = [str(c) for c in cmd]
    print("+", shlex.join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        print(proc.stdout, end="")
        raise Failure(f"{pathlib.Path(cmd[0]).name} exited with status {proc.returncode}")
    return proc.stdout


def tool(name, skip_reason=None):
    path = shutil.which(name)
    if path is None:
        if skip_reason:
            raise Skip(skip_reason)
        raise Failure(f"{name} is not on PATH (.ci/run installs it)")
    return path


def check_program_output(out, args):
    print(out, end="")
    expected = f"cohort {args.version}: 4 ranks all-reduced 10007 ints, every rank got 10"
    if expected not in out:
        raise Failure(f"the consumer printed something else than: {expected}")


def install(args, tmp):
    """Installs this build under tmp/destdir; returns (destdir, prefix, installed paths)."""
    meson = tool("meson")
    destdir = tmp / "destdir"
    run([meson, "install", "-C", args.build, "--no-rebuild", "--quiet", "--destdir", destdir])
    installed = json.loads(run([meson, "introspect", "--installed", args.build]))
    options = json.loads(run([meson, "introspect", "--buildoptions", args.build]))
    prefix = next(o["value"] for o in options if o["name"] == "prefix")

    def staged(suffix):
        hits = [p for p in installed.values() if p.endswith(suffix)]
        if len(hits) != 1:
            raise Failure(f"meson installs {len(hits)} files ending in {suffix}, expected 1")
        path = destdir / hits[0].lstrip("/")
        if not path.exists():
            raise Failure(f"{path} was not installed")
        return path

    return destdir, prefix, staged


def copy_consumer(dst):
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(CONSUMER_CPP, dst / "consumer.cpp")


def route_cmake(args, tmp):
    destdir, prefix, staged = install(args, tmp)
    config = staged("/cmake/cohort/cohortConfig.cmake")
    staged("/cmake/cohort/cohortConfigVersion.cmake")
    src = tmp / "src"
    copy_consumer(src)
    shutil.copy(HERE / "cmake" / "CMakeLists.txt", src / "CMakeLists.txt")
    cmake = tool("cmake")
    configure = [cmake, "-S", src, "-B", tmp / "build", "-DCMAKE_BUILD_TYPE=Release",
                 f"-DCMAKE_PREFIX_PATH={destdir / prefix.lstrip('/')}",
                 f"-DCMAKE_CXX_COMPILER={args.cxx[-1]}"]
    if len(args.cxx) > 1:  # e.g. ccache g++
        configure.append(f"-DCMAKE_CXX_COMPILER_LAUNCHER={';'.join(args.cxx[:-1])}")
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    out = run(configure)
    found = re.search(r"cohort (\S+) from (\S+)", out)
    if not found or found.group(1) != args.version:
        raise Failure(f"find_package did not report cohort {args.version}:\n{out}")
    if pathlib.Path(found.group(2)).resolve() != config.parent.resolve():
        raise Failure(f"find_package took {found.group(2)}, not the staged {config.parent}")
    run([cmake, "--build", tmp / "build", "-j", "1"])
    check_program_output(run([tmp / "build" / "consumer"]), args)


def route_pkg_config(args, tmp):
    destdir, _, staged = install(args, tmp)
    pc = staged("/pkgconfig/cohort.pc")
    pkg_config = tool("pkg-config")
    env = dict(os.environ,
               PKG_CONFIG_PATH=str(pc.parent),
               # The .pc file names the real prefix; the sysroot maps it into the staging dir.
               PKG_CONFIG_SYSROOT_DIR=str(destdir),
               PKG_CONFIG_ALLOW_SYSTEM_CFLAGS="1",
               PKG_CONFIG_ALLOW_SYSTEM_LIBS="1")
    version = run([pkg_config, "--modversion", "cohort"], env=env).strip()
    if version != args.version:
        raise Failure(f"pkg-config says cohort {version}, Meson says {args.version}")
    run([pkg_config, "--print-errors", "--exists", f"cohort >= {args.version}"], env=env)
    flags = shlex.split(run([pkg_config, "--cflags", "--libs", "cohort"], env=env))
    if not any(f.startswith("-I") and f.startswith(f"-I{destdir}") for f in flags):
        raise Failure(f"pkg-config's flags do not point into the staged prefix: {flags}")
    copy_consumer(tmp)
    run(args.cxx + ["-O2", tmp / "consumer.cpp", "-o", tmp / "consumer"] + flags)
    check_program_output(run([tmp / "consumer"]), args)


def route_meson_subproject(args, tmp):
    meson = tool("meson")
    src = tmp / "src"
    copy_consumer(src)
    shutil.copy(HERE / "meson-subproject" / "meson.build", src / "meson.build")
    (src / "subprojects").mkdir()
    (src / "subprojects" / "cohort").symlink_to(pathlib.Path(args.source).resolve())
    build = tmp / "build"
    env = dict(os.environ, CXX=shlex.join(args.cxx))
    # --force-fallback-for: an installed cohort.pc must not stand in for the subproject.
    run([meson, "setup", build, src, "--force-fallback-for=cohort"], env=env)

    # The subproject gives dependency('cohort') and nothing else: none of cohort's tests,
    # examples, benchmarks or tools is built, and nothing of it is installed.
    targets = json.loads(run([meson, "introspect", "--targets", build]))
    names = sorted(t["name"] for t in targets)
    if names != ["consumer"]:
        raise Failure(f"the consumer build has targets {names}, expected only ['consumer']")
    tests = json.loads(run([meson, "introspect", "--tests", build]))
    if tests:
        raise Failure(f"the subproject registered tests: {[t['name'] for t in tests]}")
    installed = json.loads(run([meson, "introspect", "--installed", build]))
    if installed:
        raise Failure(f"the subproject installs files: {sorted(installed.values())}")
    deps = json.loads(run([meson, "introspect", "--dependencies", build]))
    cohort = [d for d in deps if d["name"] == "cohort"]
    if cohort and cohort[0].get("version") not in (None, "", args.version):
        raise Failure(f"dependency('cohort') has version {cohort[0]['version']}")

    run([meson, "compile", "-C", build, "-j", "1"])
    check_program_output(run([build / "consumer"]), args)


def route_conan(args, tmp):
    conan = tool("conan", "conan is not on PATH: the Conan 2 recipe (conanfile.py) was not built")
    env = dict(os.environ, CONAN_HOME=str(tmp / "conan-home"))  # leave the user's cache alone
    version = run([conan, "--version"], env=env)
    if not re.search(r"\b2\.\d+", version):
        raise Skip(f"the recipe needs Conan 2, this is {version.strip()}")
    run([conan, "profile", "detect"], env=env)
    profiles = tmp / "conan-home" / "profiles"
    (profiles / "offline").write_text(
        "include(default)\n[settings]\ncompiler.cppstd=20\n[platform_requires]\nboost/1.81.0\n")
    (profiles / "offline17").write_text(
        "include(default)\n[settings]\ncompiler.cppstd=17\n[platform_requires]\nboost/1.81.0\n")
    # A copy of test_package, so that Conan's build folder stays out of the source tree.
    test_folder = tmp / "test_package"
    shutil.copytree(pathlib.Path(args.source) / "test_package", test_folder)

    # C++17 must be refused with a message that says what to do.
    proc = subprocess.run([conan, "create", args.source, "--profile", "offline17",
                           "--test-folder", test_folder], env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if proc.returncode == 0 or "compiler.cppstd=20" not in proc.stdout:
        print(proc.stdout)
        raise Failure("conan create with compiler.cppstd=17 was not refused with advice")

    out = run([conan, "create", args.source, "--profile", "offline", "--test-folder",
               test_folder], env=env)
    check_program_output(out, args)


def route_vcpkg(args, tmp):
    vcpkg = tool("vcpkg", "vcpkg is not on PATH: the port (ports/cohort) was not installed")
    root = pathlib.Path(os.environ.get("VCPKG_ROOT") or pathlib.Path(vcpkg).resolve().parent)
    toolchain = root / "scripts" / "buildsystems" / "vcpkg.cmake"
    if not toolchain.exists():
        raise Skip(f"vcpkg found, but not its toolchain file {toolchain} (set VCPKG_ROOT)")
    source = pathlib.Path(args.source)
    installed = tmp / "vcpkg_installed"
    env = dict(os.environ, VCPKG_FORCE_SYSTEM_BINARIES="1", VCPKG_ROOT=str(root))
    run([vcpkg, "install", "cohort",
         f"--overlay-ports={source / 'ports'}",
         f"--overlay-ports={source / 'packaging' / 'vcpkg' / 'offline-ports'}",
         f"--x-install-root={installed}", f"--x-buildtrees-root={tmp / 'buildtrees'}",
         f"--x-packages-root={tmp / 'packages'}", "--binarysource=clear"],
        cwd=tmp, env=env)  # classic mode: no vcpkg.json in tmp or above it
    src = tmp / "src"
    copy_consumer(src)
    shutil.copy(HERE / "cmake" / "CMakeLists.txt", src / "CMakeLists.txt")
    cmake = tool("cmake")
    run([cmake, "-S", src, "-B", tmp / "build", "-DCMAKE_BUILD_TYPE=Release",
         f"-DCMAKE_TOOLCHAIN_FILE={toolchain}", f"-DVCPKG_INSTALLED_DIR={installed}",
         "-DVCPKG_MANIFEST_MODE=OFF", f"-DCMAKE_CXX_COMPILER={args.cxx[-1]}"], env=env)
    run([cmake, "--build", tmp / "build", "-j", "1"], env=env)
    check_program_output(run([tmp / "build" / "consumer"]), args)


ROUTES = {
    "cmake": route_cmake,
    "pkg-config": route_pkg_config,
    "meson-subproject": route_meson_subproject,
    "conan": route_conan,
    "vcpkg": route_vcpkg,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("route", choices=sorted(ROUTES))
    parser.add_argument("--source", required=True, help="cohort's source tree")
    parser.add_argument("--build", required=True, help="the Meson build directory to install")
    parser.add_argument("--version", required=True, help="Meson's project version")
    parser.add_argument("cxx", nargs="+", help="the C++ compiler command (after --)")
    args = parser.parse_args()

    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f"cohort-consumer-{args.route}-"))
    try:
        ROUTES[args.route](args, tmp)
    except Skip as e:
        print(f"SKIP consumer {args.route}: {e}", file=sys.stderr)
        return SKIP
    except Failure as e:
        print(f"FAIL consumer {args.route}: {e}", file=sys.stderr)
        return 1
    finally:
        if os.environ.get("COHORT_KEEP_CONSUMER_TMP"):
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"consumer {args.route}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
