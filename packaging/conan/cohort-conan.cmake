# Included by the cohort-config.cmake that Conan's CMakeDeps writes (conanfile.py lists it in
# cmake_build_modules), after CMakeDeps has made cohort::cohort. It makes that package say what
# the CMake package of `meson install` and of the vcpkg port says (packaging/cohortConfig.cmake.in):
#  - cohort::cohort asks for C++20 as a compile feature, so a consumer target below C++20 is raised
#    to it, whatever the profile's compiler.cppstd was when the package was installed;
#  - this package has no CUDA part: find_package(cohort COMPONENTS cuda) is not found, with the
#    reason, where CMakeDeps alone would report it found without a cohort::cuda target.

if(TARGET cohort::cohort)
  get_target_property(_cohort_features cohort::cohort INTERFACE_COMPILE_FEATURES)
  if(NOT "cxx_std_20" IN_LIST _cohort_features)  # find_package() may include this file again
    set_property(TARGET cohort::cohort APPEND PROPERTY INTERFACE_COMPILE_FEATURES cxx_std_20)
  endif()
  unset(_cohort_features)
endif()

set(cohort_WITH_CUDA OFF)
foreach(_cohort_component IN LISTS cohort_FIND_COMPONENTS)
  if(_cohort_component STREQUAL "cohort")
    continue()
  endif()
  if(cohort_FIND_REQUIRED_${_cohort_component})
    set(cohort_FOUND FALSE)
    if(_cohort_component STREQUAL "cuda")
      string(CONCAT cohort_NOT_FOUND_MESSAGE "the Conan package of cohort has no CUDA part "
        "(cohort::cuda): its recipe does not package it yet")
    else()
      set(cohort_NOT_FOUND_MESSAGE
          "cohort has no component '${_cohort_component}' (it has: cohort, cuda)")
    endif()
  endif()
endforeach()
unset(_cohort_component)
