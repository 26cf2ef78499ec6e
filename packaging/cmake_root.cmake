# `cmake -P cmake_root.cmake` prints where CMake keeps its modules (packaging/meson.build takes
# the version file template from there).
message("${CMAKE_ROOT}")
