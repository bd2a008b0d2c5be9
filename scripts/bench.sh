#!/usr/bin/env bash
# Measures dyadfs against the filesystem of its backing directory, in one
# run, and prints the table that README.md shows. Run as root (passthrough
# and dropping caches need it). Extra arguments go to the driver, e.g.
#   scripts/bench.sh -dir /var/tmp -seq-bytes 1073741824 -files 10000
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
scripts/setup.sh >/dev/null
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "disk of -dir: $(df -T "${DYADFS_BENCH_DIR:-/var/tmp}" | awk 'NR==2 {print $1, $2}')"
exec go run ./scripts/bench -dyadfs bin/dyadfs "$@"
