#!/usr/bin/env bash
# Measures dyadfs and prints the tables README.md shows, each figure next to
# its baseline measured in the same run. Run as root (passthrough, dropping
# caches and network namespaces need it).
#
#   scripts/bench.sh                 # both tables
#   scripts/bench.sh single [ARGS]   # one node: dyadfs against its backing filesystem;
#                                    # ARGS go to the driver, e.g. -seq-bytes 1073741824
#   scripts/bench.sh cluster         # two nodes over veth: network, disk, dyadfs end to end
#   scripts/bench.sh ucx             # UCX: ucx_perftest baselines, dyadfs over TCP and UCX between
#                                    # two namespaces; one host: shared memory against TCP loopback
#   scripts/bench.sh flux            # Flux (when flux-core is installed): raw Flux RPC rates,
#                                    # dyadfs with the Flux store over each transport, DYAD itself
#   scripts/bench.sh checksum        # what hashing the content costs (producer and consumer)
#   scripts/bench.sh cost            # what one file costs on two nodes: CPU of etcd and each daemon,
#                                    # transactions, database bytes, FUSE requests; 16 writers
#                                    # against one; a ring of 2 and 4 nodes; etcd's CPU by
#                                    # publishes per transaction
#   scripts/bench.sh space           # node-local space: what a cache capacity costs (eviction),
#                                    # and a 1 GiB file read in ranges against fetched whole
#   scripts/bench.sh compare OLD NEW [ROUNDS]
#                                    # two dyadfs binaries, alternating (ROUNDS each, 3 by
#                                    # default): the rows every release has, on two nodes
#                                    # and on one (small-file creates)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
scripts/setup.sh >/dev/null
. scripts/buildenv.sh
what=${1:-all}
shift || true
# The tests' temporary directories (mounts, backing directories) go on
# disk, not on /tmp's tmpfs, where a machine may have one.
tmp=$(mktemp -d /var/tmp/dyadfs-bench-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# wants PART: whether the part PART of the benchmarks was asked for.
wants() { [[ $what == all || $what == "$1" ]]; }
# built_with TAG PART WHY: whether the build has the optional backend TAG;
# if not, says that PART is skipped, and WHY.
built_with() {
	[[ ,$DYADFS_TAGS, == *,"$1",* ]] && return 0
	echo "== $2: skipped ($3)"
	return 1
}
# bench_test NAME [GO-TEST-FLAGS...]: runs the end-to-end benchmark NAME
# of ./test/ once, its temporary directories on disk.
bench_test() {
	local name=$1
	shift
	TMPDIR=$tmp go test "$@" -run '^$' -bench "^$name\$" -benchtime 1x -timeout 30m ./test/
}

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "disk: $(df -T /var/tmp | awk 'NR==2 {print $1, $2}')"

# The cluster part runs first: the single-node part frees tens of thousands
# of inodes, and for half a minute after that an ext4 without a journal
# allocates inodes slowly (it skips recently deleted ones one by one).
if [[ $what == compare ]]; then
	old=${1:?usage: scripts/bench.sh compare OLD-BINARY NEW-BINARY [ROUNDS]}
	new=${2:?usage: scripts/bench.sh compare OLD-BINARY NEW-BINARY [ROUNDS]}
	rounds=${3:-3}
	go test -c -o "$tmp/test.bin" ./test/
	go build -o "$tmp/bench.bin" ./scripts/bench
	measure() {
		(cd test && TMPDIR=$tmp DYADFS_TEST_BIN=$(realpath "$1") DYADFS_BENCH_ROWS=compare \
			"$tmp/test.bin" -test.run '^$' -test.bench '^BenchmarkCluster$' -test.benchtime 1x -test.timeout 30m 2>/dev/null) |
			sed -n '/^ *figure/,/^$/p'
		"$tmp/bench.bin" -dyadfs "$1" -dir /var/tmp -seq-bytes 67108864 -wakes 200 | grep -E '^ *figure|create|wake'
	}
	# A first run warms up the machine and is not shown: the first run
	# after a quiet while is the fastest (no recently freed inodes). The
	# order then alternates (old new, new old, ...), so that neither
	# binary always runs first.
	measure "$new" >/dev/null
	for round in $(seq 1 "$rounds"); do
		order=("$old" "$new")
		((round % 2 == 0)) && order=("$new" "$old")
		for bin in "${order[@]}"; do
			echo
			echo "== round $round: $bin"
			measure "$bin"
		done
	done
	exit 0
fi

if wants cluster; then
	echo
	echo "== two nodes over veth"
	bench_test BenchmarkCluster | sed -n '/^ *figure/,/^latency is/p'
fi

if wants space; then
	echo
	echo "== node-local space: two nodes over veth, the settings taking turns"
	bench_test BenchmarkClusterEviction | sed -n '/^ *figure/,/^ *$/p'
	bench_test BenchmarkClusterRanges | sed -n '/^ *figure/,/^ *$/p'
fi

if wants cost; then
	echo "== what one file costs: two nodes over veth, etcd on tmpfs"
	bench_test BenchmarkClusterCost | grep -v '^\(goos\|goarch\|pkg\|cpu\|PASS\|ok\|Benchmark\)'
	echo
	echo "== what a publish costs etcd and the daemon's client, by publishes per transaction (etcd on tmpfs)"
	go test -run '^$' -bench BenchmarkEtcdCPUByBatch -benchtime 1x ./hfl/store/etcd/ | grep '^Benchmark'
fi
if wants ucx; then
	echo
	if built_with ucx UCX "built without UCX: libucx-dev is not installed"; then
		echo "== UCX between two namespaces (UCX_TLS=tcp), end to end, the transports alternating over rounds"
		bench_test BenchmarkClusterTransports -tags "$DYADFS_TAGS" | sed -n '/^ *figure/,/^latency is/p'
		echo
		echo "== the transports alone: between two namespaces (FetchNetns, UCX_TLS=tcp, against ucx_perftest there),"
		echo "   and on one host: shared memory (ucx-shm: UCX_TLS=sm,tcp) and TCP (ucx-tcp) against the TCP transport on loopback"
		go test -tags "$DYADFS_TAGS" -run '^$' -bench . -benchtime 2s -timeout 30m ./dtl/ucx/ | grep -E '^(Benchmark|ucx_perftest|[a-z ]+:)'
	fi
fi

if wants flux; then
	echo
	if built_with flux Flux "flux-core is not installed: run ../shared/flux/install.sh"; then
		echo "== Flux: two brokers (flux start --test-size=2)"
		bench_test BenchmarkFlux -tags "$DYADFS_TAGS" |
			sed -n '/^ *figure/,$p' | grep -v -E '^(PASS|ok|goos|goarch|pkg|cpu)'
	fi
fi

if wants checksum; then
	echo
	echo "== what the content checksum costs: XXH3 over 1 MiB blocks (internal/digest)"
	echo "   File: the producer hashing a file in the page cache at publish, on every core;"
	echo "   Tracker: the consumer hashing what arrives, as it is written; Bytes4K: a small file"
	go test -run '^$' -bench . -benchtime 2s ./internal/digest/ | grep -E '^Benchmark'
fi

if wants single; then
	echo
	echo "== one node: dyadfs against its backing filesystem"
	go run ./scripts/bench -dyadfs bin/dyadfs -dir /var/tmp "$@"
fi
