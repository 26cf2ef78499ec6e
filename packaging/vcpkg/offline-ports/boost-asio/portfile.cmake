# Stub boost-asio for building ports/cohort offline: the real port downloads Boost. It installs
# nothing, so find_package(Boost 1.81 CONFIG) in cohortConfig.cmake finds the system's Boost
# (Debian: apt-get install libboost1.81-dev). Never use it where the real port can be had.
set(VCPKG_POLICY_EMPTY_PACKAGE enabled)
