"""Conan 2 recipe for cohort, a header-only C++20 library of collective communication.

    conan create . --profile offline          # README.md, "Install", has the profile

The package holds the headers only; consumers get the CMake target cohort::cohort (CMakeDeps)
or the pkg-config name cohort (PkgConfigDeps, which MesonToolchain points Meson at). Both carry
C++20 themselves, as the packages of `meson install` and vcpkg do: the target asks for the
compile feature cxx_std_20 (packaging/conan/cohort-conan.cmake) and cohort.pc's Cflags hold
-std=c++20.
"""
import os

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy
from conan.tools.layout import basic_layout
from conan.tools.scm import Version

required_conan_version = ">=2.0"


class CohortConan(ConanFile):
    name = "cohort"
    version = "0.1.0"  # Meson's project version; tests/consumers/check_version.py checks it
    description = "Header-only C++20 collective communication for data-parallel training"
    license = "Apache-2.0"
    topics = ("collective-communication", "all-reduce", "distributed-training", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {"with_cuda": [True, False]}
    default_options = {"with_cuda": False}
    exports_sources = "include/*", "LICENSE", "packaging/conan/*"
    no_copy_source = True

    # Compilers known to build cohort's C++20 (README.md, "Requirements").
    _minimum_compilers = {"gcc": "12", "clang": "14"}

    def layout(self):
        basic_layout(self, src_folder=".")

    def requirements(self):
        # Asio (the TCP transport) is in the public headers, hence transitive_headers.
        # Boost 1.74's Asio fails C++20 coroutines on g++ 12 and lacks as_tuple and channels.
        self.requires("boost/[>=1.81.0]", transitive_headers=True)

    def package_id(self):
        self.info.clear()

    def validate(self):
        # Also refused when unset: g++ 12 and clang 14 then compile C++17.
        try:
            check_min_cppstd(self, 20)
        except ConanInvalidConfiguration:
            cppstd = self.settings.get_safe("compiler.cppstd")
            said = f"says compiler.cppstd={cppstd}" if cppstd else "does not set compiler.cppstd"
            raise ConanInvalidConfiguration(
                f"{self.ref} needs C++20 and the profile {said} (`conan profile detect` writes "
                "gnu17): set compiler.cppstd=20 (or gnu20) under [settings] in the profile, or "
                "pass -s compiler.cppstd=20") from None
        compiler = str(self.settings.compiler)
        minimum = self._minimum_compilers.get(compiler)
        if minimum and Version(self.settings.compiler.version) < minimum:
            raise ConanInvalidConfiguration(
                f"{self.ref} needs {compiler} >= {minimum} for its C++20 "
                f"(found {self.settings.compiler.version})")
        if self.options.with_cuda:
            raise ConanInvalidConfiguration(
                f"{self.ref}: with_cuda=True needs the cohort-cuda library (CUDA kernels and the "
                "CUDA IPC transport), which this version does not ship yet; use with_cuda=False")

    def build(self):
        pass  # headers only

    _build_module = os.path.join("lib", "cmake", "cohort-conan.cmake")

    def package(self):
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))
        copy(self, "*.hpp", os.path.join(self.source_folder, "include"),
             os.path.join(self.package_folder, "include"))
        copy(self, "cohort-conan.cmake", os.path.join(self.source_folder, "packaging", "conan"),
             os.path.join(self.package_folder, "lib", "cmake"))

    def package_info(self):
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.set_property("cmake_file_name", "cohort")
        self.cpp_info.set_property("cmake_target_name", "cohort::cohort")
        # Before 1.0 a minor release may break (docs/VERSIONING.md): find_package(cohort 0.1)
        # accepts 0.1.x only, as with the CMake package of `meson install` and vcpkg.
        if Version(self.version) < "1":
            self.cpp_info.set_property("cmake_config_version_compat", "SameMinorVersion")
        # CMakeDeps has no property for compile features: this module adds cxx_std_20 to
        # cohort::cohort after CMakeDeps made it (and refuses COMPONENTS cuda).
        self.cpp_info.set_property("cmake_build_modules", [self._build_module])
        self.cpp_info.set_property("pkg_config_name", "cohort")
        # For PkgConfigDeps' cohort.pc, whose Cflags then say C++20 as Meson's cohort.pc does.
        # CMakeDeps passes it on too, harmlessly: CMake writes its own -std flag after a target's
        # compile options, so a consumer at C++23 stays at C++23.
        if self.settings.get_safe("compiler") != "msvc":
            self.cpp_info.cxxflags = ["-std=c++20"]
        if self.settings.os in ("Linux", "FreeBSD"):
            self.cpp_info.system_libs = ["pthread"]
