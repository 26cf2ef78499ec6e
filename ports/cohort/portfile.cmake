# vcpkg port of cohort, header-only: copies the headers and writes the CMake package with
# CMake's own helpers (vcpkg_configure_meson would download Meson). The package is the same
# cohortConfig.cmake that `meson install` writes, from packaging/cohortConfig.cmake.in.
#
# This is an overlay port that builds the cohort checkout it sits in (ports/cohort/):
#   vcpkg install cohort --overlay-ports=ports
# A registry port would fetch a release instead, e.g. vcpkg_from_github(OUT_SOURCE_PATH
# SOURCE_PATH REPO <owner>/cohort REF "v${VERSION}" SHA512 <sha512 of the tarball>).

get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
if(NOT EXISTS "${SOURCE_PATH}/include/cohort/version.hpp")
  message(FATAL_ERROR "ports/cohort builds the cohort checkout it sits in, and ${SOURCE_PATH} "
                      "is not one: use the port from inside a cohort checkout (see portfile.cmake)")
endif()

# vcpkg keys its binary cache on the port's files, not on the headers this port copies:
# header changes need `--binarysource=clear` (or a new port version).
set(VCPKG_BUILD_TYPE release)  # nothing to build, so no debug tree either
# No ELF file is installed, but vcpkg's rpath fix-up scans every file without a known extension
# (such as share/cohort/usage) and, to do so, downloads patchelf: with this off, the port installs
# offline.
set(VCPKG_FIXUP_ELF_RPATH OFF)

file(INSTALL "${SOURCE_PATH}/include/cohort" DESTINATION "${CURRENT_PACKAGES_DIR}/include")

include(CMakePackageConfigHelpers)
set(COHORT_INCLUDEDIR include)
set(COHORT_WITH_CUDA OFF)    # the CUDA part is not in this port
set(COHORT_CUDA_LIBRARY "")
configure_package_config_file(
  "${SOURCE_PATH}/packaging/cohortConfig.cmake.in"
  "${CURRENT_PACKAGES_DIR}/share/${PORT}/cohortConfig.cmake"
  INSTALL_DESTINATION "share/${PORT}"
  INSTALL_PREFIX "${CURRENT_PACKAGES_DIR}")
# Before 1.0 a minor release may break (docs/VERSIONING.md), hence SameMinorVersion.
if(VERSION VERSION_LESS 1)
  set(_cohort_compatibility SameMinorVersion)
else()
  set(_cohort_compatibility SameMajorVersion)
endif()
write_basic_package_version_file(
  "${CURRENT_PACKAGES_DIR}/share/${PORT}/cohortConfigVersion.cmake"
  VERSION "${VERSION}"
  COMPATIBILITY ${_cohort_compatibility}
  ARCH_INDEPENDENT)

file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
