#!/usr/bin/env bash
# Runs every dyadfs test: formatting, go vet, the unit tests and the
# integration tests (which mount real filesystems and run real programs),
# all under the race detector. Run as root; it installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

scripts/setup.sh

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [[ -n $unformatted ]]; then
	echo "gofmt would change:" >&2
	echo "$unformatted" >&2
	exit 1
fi
echo "== go vet"
go vet ./...
echo "== go test -race"
go test -race -count=1 -timeout 60m ./...

# A test binary killed by its timeout cannot run its cleanups: report what
# it left, then remove it, so that the machine is clean either way.
echo "== leftovers"
leftover=0
while read -r mnt; do
	echo "a dyadfs mount was left behind: $mnt" >&2
	fusermount3 -u -z "$mnt" || true
	leftover=1
done < <(awk '$0 ~ / - fuse\.dyadfs / {print $5}' /proc/self/mountinfo)
if pgrep -x dyadfs >/dev/null; then
	echo "dyadfs processes were left behind:" >&2
	pgrep -a -x dyadfs >&2
	pkill -KILL -x dyadfs || true
	leftover=1
fi
if ((leftover)); then
	exit 1
fi
echo "all tests passed"
