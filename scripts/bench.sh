#!/usr/bin/env bash
# Measures dyadfs and prints the tables README.md shows, each figure next to
# its baseline measured in the same run. Run as root (passthrough, dropping
# caches and network namespaces need it).
#
#   scripts/bench.sh                 # both tables
#   scripts/bench.sh single [ARGS]   # one node: dyadfs against its backing filesystem;
#                                    # ARGS go to the driver, e.g. -seq-bytes 1073741824
#   scripts/bench.sh cluster         # two nodes over veth: network, disk, dyadfs end to end
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
scripts/setup.sh >/dev/null
what=${1:-all}
shift || true

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "disk: $(df -T /var/tmp | awk 'NR==2 {print $1, $2}')"

# The cluster part runs first: the single-node part frees tens of thousands
# of inodes, and for half a minute after that an ext4 without a journal
# allocates inodes slowly (it skips recently deleted ones one by one).
if [[ $what == all || $what == cluster ]]; then
	echo
	echo "== two nodes over veth"
	tmp=$(mktemp -d /var/tmp/dyadfs-bench-XXXXXX)
	trap 'rm -rf "$tmp"' EXIT
	TMPDIR=$tmp go test -run '^$' -bench '^BenchmarkCluster$' -benchtime 1x -timeout 30m ./test/ |
		sed -n '/^ *figure/,/^latency is/p'
fi

if [[ $what == all || $what == single ]]; then
	echo
	echo "== one node: dyadfs against its backing filesystem"
	go run ./scripts/bench -dyadfs bin/dyadfs -dir /var/tmp "$@"
fi
