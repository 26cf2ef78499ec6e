#!/usr/bin/env python3
"""Builds and runs consumer.cpp the way a user of one packaging route would, against this tree.

usage: consume.py ROUTE --source DIR --build DIR --version X.Y.Z -- CXX [ARGS...]

Routes (README.md, "Install", gives the same commands to users):
  cmake                `meson install --tags devel --destdir` this build (the C++ developer's
                       part), then find_package(cohort CONFIG)
  pkg-config           the same install, then g++ $(pkg-config --cflags --libs)
  meson-subproject     a Meson project whose subprojects/cohort is this source tree
  conan-cmakedeps      `conan create` (and test_package), then a CMake consumer: CMakeDeps and
                       CMakeToolchain
  conan-pkgconfigdeps  `conan create`, then a Meson consumer: PkgConfigDeps and MesonToolchain
  vcpkg-classic        `vcpkg install cohort` with the overlay ports, then a CMake consumer
  vcpkg-manifest       a CMake consumer with vcpkg.json and vcpkg-configuration.json

Conan and vcpkg are taken from ../shared/tools/ beside the source tree (as CI has them), else
from PATH; a route skips only when neither has its tool. Conan runs with a fresh CONAN_HOME and
vcpkg from a copy of its root with its binary cache beside it, both in the route's temporary
directory, so nothing outside it is read or written (but the tools and the compilers).

The CMake consumers (tests/consumers/cmake) pin themselves to C++17 and build only because
cohort::cohort asks for cxx_std_20; the pkg-config and Meson ones set no standard and build
only because cohort.pc asks for -std=c++20.

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
import time
import types

SKIP = 77
START = time.monotonic()
HERE = pathlib.Path(__file__).resolve().parent
CONSUMER_CPP = HERE / "consumer.cpp"


class Failure(Exception):
    pass


class Skip(Exception):
    pass


def run(cmd, cwd=None, env=None):
    """Runs cmd, echoing it; returns its stdout+stderr; raises Failure on a non-zero exit."""
    cmd = [str(c) for c in cmd]
    print(f"+ [{time.monotonic() - START:.1f} s]", shlex.join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        print(proc.stdout, end="")
        raise Failure(f"{pathlib.Path(cmd[0]).name} exited with status {proc.returncode}")
    return proc.stdout


def tool(name):
    path = shutil.which(name)
    if path is None:
        raise Failure(f"{name} is not on PATH (.ci/run installs it)")
    return path


def check_program_output(out, args):
    print(out, end="")
    expected = f"cohort {args.version}: 4 ranks all-reduced 10007 ints, every rank got 10"
    if expected not in out:
        raise Failure(f"the consumer printed something else than: {expected}")


def check_found(out, args, within):
    """Checks that the consumer's CMake configure found cohort args.version under within (the
    consumer's CMakeLists.txt prints "cohort VERSION from DIR")."""
    found = re.search(r"^-- cohort (\S+) from (\S+)$", out, re.MULTILINE)
    if not found or found.group(1) != args.version:
        raise Failure(f"find_package did not report cohort {args.version}:\n{out}")
    where = pathlib.Path(found.group(2)).resolve()
    if not where.is_relative_to(pathlib.Path(within).resolve()):
        raise Failure(f"find_package took cohort from {where}, not from {within}")
    print(f"find_package found cohort {args.version} in {where}")
    return where


def install(args, tmp):
    """Installs this build under tmp/destdir; returns the staging directory (destdir), the
    prefix, Meson's options, the installed files and staged(suffix), the one staged path that
    ends in suffix."""
    meson = tool("meson")
    destdir = tmp / "destdir"
    # The C++ developer's part (headers, cohort.pc, the CMake package, the CUDA library): what a
    # consumer builds against, and all that is built before these tests run.
    run([meson, "install", "-C", args.build, "--no-rebuild", "--quiet", "--tags", "devel",
         "--destdir", destdir])
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

    return types.SimpleNamespace(destdir=destdir, prefix=prefix, staged=staged,
                                 installed=installed,
                                 options={o["name"]: o["value"] for o in options})


def copy_consumer(dst):
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(CONSUMER_CPP, dst / "consumer.cpp")


def route_cmake(args, tmp):
    staging = install(args, tmp)
    destdir, prefix, staged = staging.destdir, staging.prefix, staging.staged
    config = staged("/cmake/cohort/cohortConfig.cmake")
    staged("/cmake/cohort/cohortConfigVersion.cmake")
    # Where README.md says it goes: datadir (share/cmake/cohort) while the package is headers
    # only, libdir (lib/<triplet>/cmake/cohort) once it holds the compiled CUDA library.
    with_cuda = any(pathlib.Path(p).name.startswith("libcohort-cuda")
                    for p in staging.installed.values())
    base = staging.options["libdir" if with_cuda else "datadir"]
    expected = pathlib.Path(prefix) / base / "cmake" / "cohort"
    if config.parent != destdir / str(expected).lstrip("/"):
        raise Failure(f"the CMake package went to {config.parent}, not to {expected} "
                      f"({'with' if with_cuda else 'without'} the CUDA library), as README.md says")
    src = tmp / "src"
    copy_consumer(src)
    shutil.copy(HERE / "cmake" / "CMakeLists.txt", src / "CMakeLists.txt")
    cmake = tool("cmake")
    configure = [cmake, "-S", src, "-B", tmp / "build", "-DCMAKE_BUILD_TYPE=Release",
                 f"-DCMAKE_PREFIX_PATH={destdir / prefix.lstrip('/')}",
                 "-DCOHORT_CONSUMER_CXX_STANDARD=17",
                 f"-DCMAKE_CXX_COMPILER={args.cxx[-1]}"]
    if len(args.cxx) > 1:  # e.g. ccache g++
        configure.append(f"-DCMAKE_CXX_COMPILER_LAUNCHER={';'.join(args.cxx[:-1])}")
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    out = run(configure)
    if check_found(out, args, within=config.parent) != config.parent.resolve():
        raise Failure(f"find_package did not take the staged {config.parent}")
    run([cmake, "--build", tmp / "build", "-j", "1"])
    check_program_output(run([tmp / "build" / "consumer"]), args)


def route_pkg_config(args, tmp):
    staging = install(args, tmp)
    destdir = staging.destdir
    pc = staging.staged("/pkgconfig/cohort.pc")
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


def tools_dir(args):
    """The package managers CI provides beside the checkout (../shared/tools/README.md)."""
    return pathlib.Path(args.source).resolve().parent / "shared" / "tools"


def clean_env(prefixes, **settings):
    """os.environ without the caller's settings for a tool (so that no user cache, profile or
    overlay leaks in), plus settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.update({k: str(v) for k, v in settings.items()})
    return env


def find_conan(args):
    """Conan 2 from ../shared/tools/conan, else from PATH; skips only when neither has it."""
    shared = tools_dir(args) / "conan" / "bin" / "conan"
    if os.access(shared, os.X_OK):
        return str(shared)
    on_path = shutil.which("conan")
    if on_path:
        return on_path
    raise Skip(f"Conan is neither in {shared.parent.parent} nor on PATH: the Conan 2 recipe "
               "(conanfile.py) was not built")


def conan_setup(args, tmp):
    """A fresh CONAN_HOME under tmp with the README's profiles; returns (conan, env)."""
    conan = find_conan(args)
    # The compiler Meson uses; `conan profile detect` and CMake both read CXX.
    env = clean_env(("CONAN_",), CONAN_HOME=tmp / "conan-home", CXX=args.cxx[-1])
    proc = subprocess.run([conan, "--version"], env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        print(proc.stdout, end="")
        raise Failure(f"{conan} does not run: Conan 2.8 from source needs Debian's python3-requests "
                      "python3-yaml python3-jinja2 python3-dateutil python3-distro "
                      "python3-fasteners python3-colorama python3-urllib3 python3-patch-ng")
    if not re.search(r"\b2\.\d+", proc.stdout):
        raise Failure(f"the recipe needs Conan 2, {conan} is {proc.stdout.strip()}")
    print(f"{conan}: {proc.stdout.strip()}")
    run([conan, "profile", "detect"], env=env)
    profiles = tmp / "conan-home" / "profiles"
    # README.md, "Conan 2": the detected profile plus C++20 and the system's Boost.
    (profiles / "offline").write_text(
        "include(default)\n[settings]\ncompiler.cppstd=20\n[platform_requires]\nboost/1.81.0\n")
    return conan, env


def route_conan_cmakedeps(args, tmp):
    """`conan create` (with test_package), then the README's consumer: CMakeDeps + CMakeToolchain
    and tests/consumers/cmake/CMakeLists.txt, pinned to C++17 so that it builds only if
    cohort::cohort asks for C++20 itself."""
    conan, env = conan_setup(args, tmp)
    (tmp / "conan-home" / "profiles" / "offline17").write_text(
        "include(offline)\n[settings]\ncompiler.cppstd=17\n")

    # C++17 must be refused with a message that says what to do.
    proc = subprocess.run([conan, "create", args.source, "--profile", "offline17",
                           "--test-folder", ""], env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if proc.returncode == 0 or "compiler.cppstd=20" not in proc.stdout:
        print(proc.stdout)
        raise Failure("conan create with compiler.cppstd=17 was not refused with advice")

    # A copy of test_package, so that Conan's build folder stays out of the source tree.
    test_folder = tmp / "test_package"
    shutil.copytree(pathlib.Path(args.source) / "test_package", test_folder)
    out = run([conan, "create", args.source, "--profile", "offline", "--test-folder",
               test_folder], env=env)
    check_program_output(out, args)

    app = tmp / "app"
    copy_consumer(app)
    shutil.copy(HERE / "cmake" / "CMakeLists.txt", app / "CMakeLists.txt")
    (app / "conanfile.txt").write_text(
        f"[requires]\ncohort/{args.version}\n\n[generators]\nCMakeDeps\nCMakeToolchain\n")
    # README.md's commands, run in the consumer's folder.
    run([conan, "install", ".", "--profile", "offline", "--output-folder=build"],
        cwd=app, env=env)
    cmake = tool("cmake")
    out = run([cmake, "-S", ".", "-B", "build",
               "-DCMAKE_TOOLCHAIN_FILE=build/conan_toolchain.cmake", "-DCMAKE_BUILD_TYPE=Release",
               "-DCOHORT_CONSUMER_CXX_STANDARD=17"], cwd=app, env=env)
    check_found(out, args, within=app / "build")
    run([cmake, "--build", "build", "-j", "1"], cwd=app, env=env)
    check_program_output(run([app / "build" / "consumer"]), args)


def route_conan_pkgconfigdeps(args, tmp):
    """`conan create`, then a Meson consumer through PkgConfigDeps + MesonToolchain whose
    C++ standard is left to the compiler: it builds only if cohort.pc says C++20."""
    conan, env = conan_setup(args, tmp)
    run([conan, "create", args.source, "--profile", "offline", "--test-folder", ""], env=env)

    app = tmp / "app"
    copy_consumer(app)
    shutil.copy(HERE / "meson-pkgconfig" / "meson.build", app / "meson.build")
    (app / "conanfile.txt").write_text(
        f"[requires]\ncohort/{args.version}\n\n[generators]\nPkgConfigDeps\nMesonToolchain\n")
    # README.md's commands, run in the consumer's folder.
    run([conan, "install", ".", "--profile", "offline", "--output-folder=conan"],
        cwd=app, env=env)
    generators = app / "conan"

    pkg_config = tool("pkg-config")
    pc_env = dict(env, PKG_CONFIG_PATH=str(generators))
    version = run([pkg_config, "--modversion", "cohort"], env=pc_env).strip()
    if version != args.version:
        raise Failure(f"Conan's cohort.pc says version {version}, Meson says {args.version}")
    cflags = shlex.split(run([pkg_config, "--cflags", "cohort"], env=pc_env))
    if "-std=c++20" not in cflags:
        raise Failure(f"Conan's cohort.pc does not ask for C++20: Cflags {cflags}")

    meson = tool("meson")
    # MesonToolchain's native file sets cpp_std from the profile (c++20); -Dcpp_std=none takes
    # that back, so the compiler's default (gnu++17 for g++ 12) holds unless cohort.pc says more.
    run([meson, "setup", "build", "--native-file", "conan/conan_meson_native.ini",
         "-Dcpp_std=none"], cwd=app, env=env)
    deps = json.loads(run([meson, "introspect", "--dependencies", "build"], cwd=app))
    cohort = [d for d in deps if d["name"] == "cohort"]
    if not cohort or cohort[0].get("version") != args.version:
        raise Failure(f"Meson's dependency('cohort') is not Conan's {args.version}: {cohort}")
    run([meson, "compile", "-C", "build", "-j", "1"], cwd=app, env=env)
    check_program_output(run([app / "build" / "consumer"]), args)


def vcpkg_setup(args, tmp):
    """A writable copy of a vcpkg root (vcpkg writes into its root) and the environment the
    README gives; returns (vcpkg, env)."""
    shared = tools_dir(args) / "vcpkg"
    if os.access(shared / "vcpkg", os.X_OK):
        root = shared
    else:
        on_path = shutil.which("vcpkg")
        if on_path is None:
            raise Skip(f"vcpkg is neither in {shared} nor on PATH: the port (ports/cohort) was "
                       "not installed")
        root = pathlib.Path(os.environ.get("VCPKG_ROOT") or pathlib.Path(on_path).resolve().parent)
    if not (root / "scripts" / "buildsystems" / "vcpkg.cmake").exists():
        raise Failure(f"{root} is not a vcpkg root (no scripts/buildsystems/vcpkg.cmake): "
                      "set VCPKG_ROOT")
    copy = tmp / "vcpkg-root"
    # What vcpkg made there before (and its git history) is not needed and may be large.
    shutil.copytree(root, copy, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", "buildtrees", "packages", "installed", "downloads"))
    for d, _, files in os.walk(copy):  # the shared copy is read-only
        os.chmod(d, 0o755)
        for f in files:
            path = os.path.join(d, f)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | 0o200)
    # Manifest mode needs the builtin ports/ folder, which a checkout of the ports tree has and
    # the shared root (all ports from overlays, its empty ports/ not kept) lacks.
    (copy / "ports").mkdir(exist_ok=True)
    cache = tmp / "vcpkg-cache"
    cache.mkdir()
    env = clean_env(("VCPKG_", "X_VCPKG_"), VCPKG_ROOT=copy, VCPKG_FORCE_SYSTEM_BINARIES=1,
                    VCPKG_DISABLE_METRICS=1, VCPKG_DEFAULT_BINARY_CACHE=cache,
                    CXX=args.cxx[-1])
    return copy / "vcpkg", env


def vcpkg_consumer(args, tmp, app, env, installed):
    """Builds and runs tests/consumers/cmake in app with vcpkg's toolchain (the README's CMake
    line: no build type, so no optimisation either), pinned to C++17 like the Conan consumer."""
    copy_consumer(app)
    shutil.copy(HERE / "cmake" / "CMakeLists.txt", app / "CMakeLists.txt")
    toolchain = pathlib.Path(env["VCPKG_ROOT"]) / "scripts" / "buildsystems" / "vcpkg.cmake"
    cmake = tool("cmake")
    out = run([cmake, "-S", ".", "-B", "build", f"-DCMAKE_TOOLCHAIN_FILE={toolchain}",
               "-DCOHORT_CONSUMER_CXX_STANDARD=17"], cwd=app, env=env)
    check_found(out, args, within=installed)
    run([cmake, "--build", "build", "-j", "1"], cwd=app, env=env)
    check_program_output(run([app / "build" / "consumer"]), args)


def vcpkg_overlays(args):
    source = pathlib.Path(args.source).resolve()
    return [source / "ports", source / "packaging" / "vcpkg" / "offline-ports"]


def route_vcpkg_classic(args, tmp):
    """README.md, "vcpkg", classic mode: `vcpkg install cohort` with the overlay ports, then a
    CMake project with vcpkg's toolchain."""
    vcpkg, env = vcpkg_setup(args, tmp)
    # No vcpkg.json in tmp or above it: classic mode, installing into the root's installed/.
    run([vcpkg, "install", "cohort"] + [f"--overlay-ports={p}" for p in vcpkg_overlays(args)],
        cwd=tmp, env=env)
    vcpkg_consumer(args, tmp, tmp / "app", env, tmp / "vcpkg-root" / "installed")


def route_vcpkg_manifest(args, tmp):
    """README.md, "vcpkg", manifest mode: vcpkg.json and vcpkg-configuration.json (the overlay
    ports) beside CMakeLists.txt; vcpkg's toolchain installs cohort while CMake configures."""
    _, env = vcpkg_setup(args, tmp)
    app = tmp / "app"
    app.mkdir()
    (app / "vcpkg.json").write_text(json.dumps({"dependencies": ["cohort"]}, indent=2) + "\n")
    (app / "vcpkg-configuration.json").write_text(json.dumps(
        {"overlay-ports": [str(p) for p in vcpkg_overlays(args)]}, indent=2) + "\n")
    vcpkg_consumer(args, tmp, app, env, app / "build" / "vcpkg_installed")


ROUTES = {
    "cmake": route_cmake,
    "pkg-config": route_pkg_config,
    "meson-subproject": route_meson_subproject,
    "conan-cmakedeps": route_conan_cmakedeps,
    "conan-pkgconfigdeps": route_conan_pkgconfigdeps,
    "vcpkg-classic": route_vcpkg_classic,
    "vcpkg-manifest": route_vcpkg_manifest,
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
