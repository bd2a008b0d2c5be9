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

echo "== leftovers"
if grep -q ' fuse\.dyadfs ' /proc/self/mountinfo; then
	echo "a dyadfs mount was left behind:" >&2
	grep ' fuse\.dyadfs ' /proc/self/mountinfo >&2
	exit 1
fi
if pgrep -x dyadfs >/dev/null; then
	echo "a dyadfs process was left behind:" >&2
	pgrep -a -x dyadfs >&2
	exit 1
fi
echo "all tests passed"
