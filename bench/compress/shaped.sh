#!/bin/sh
# Runs a command in a private network namespace whose loopback is shaped by a token bucket,
# to measure over TCP where the network, not memory, is the bottleneck. Root only; nothing
# outside the namespace is touched, and it disappears with the command.
#
#   unshare -n bench/compress/shaped.sh 10gbit chrt -f 1 \
#       build/bench/compress/bench_compressed_all_reduce --transport tcp --mib 16,64
#
# The rate is shared by every stream on the loopback, both directions included.
set -e
rate=$1
shift
ip link set lo up
tc qdisc add dev lo root tbf rate "$rate" burst "${BURST:-512kb}" latency 50ms
exec "$@"
