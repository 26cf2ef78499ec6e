/// @file
/// The asynchronous layer: the progress thread, `async_` collectives with Asio completion
/// tokens, and gradient bucketing. Needs Boost.Asio (>= 1.81); not for files nvcc compiles.
/// Also includes the synchronous `local_sgd` (cohort/training/local_sgd.hpp, which needs no
/// Asio), where it was found before.
#pragma once

#include <cohort/async/collectives.hpp>
#include <cohort/async/gradient_buckets.hpp>
#include <cohort/async/progress_thread.hpp>
#include <cohort/training/local_sgd.hpp>
