/// @file
/// The library's version; agrees with the Meson project version.
#pragma once

#define COHORT_VERSION_MAJOR 0
#define COHORT_VERSION_MINOR 1
#define COHORT_VERSION_PATCH 0
#define COHORT_VERSION_STRING "0.1.0"
