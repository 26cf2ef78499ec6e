/// @file
/// Each generation of an elastic job over TCP (kept apart from <cohort/elastic.hpp>, which
/// does not parse Asio).
#pragma once

#include <utility>

#include <cohort/elastic.hpp>
#include <cohort/transport/tcp.hpp>

namespace cohort::elastic {

/// Builds each generation's communicator over TCP, meeting at `s` (the job's store) under the
/// generation's own job id "<job>-g<G>", so no generation reads another's keys.
struct tcp_generations {
  store* s;
  tcp_options opts{};
  tcp_communicator operator()(const generation& g) const {
    launch_info info;
    info.rank = g.rank;
    info.size = g.size();
    info.local_rank = g.rank;
    info.local_size = g.size();
    info.job_id = g.job_id;
    return make_tcp_communicator(info, *s, opts);
  }
};

}  // namespace cohort::elastic
