/// @file
/// The whole library: include this, or the one header you use.
#pragma once

#include <cohort/version.hpp>
#include <cohort/core/buffer.hpp>
#include <cohort/core/communicator.hpp>
#include <cohort/core/concepts.hpp>
#include <cohort/core/dtype.hpp>
#include <cohort/core/error.hpp>
#include <cohort/core/ops.hpp>
#include <cohort/core/options.hpp>
#include <cohort/collectives/all_gather.hpp>
#include <cohort/collectives/all_reduce.hpp>
#include <cohort/collectives/barrier.hpp>
#include <cohort/collectives/broadcast.hpp>
#include <cohort/collectives/reduce.hpp>
#include <cohort/collectives/reduce_scatter.hpp>
#include <cohort/training/local_sgd.hpp>
#include <cohort/transport/loopback.hpp>
