#!/usr/bin/env bash
# Runs every dyadfs test: formatting, go vet, the unit tests and the
# integration tests (which mount real filesystems and run real programs),
# all under the race detector. Run as root; it installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

scripts/setup.sh
. scripts/buildenv.sh
echo "== build tags: ${DYADFS_TAGS:-none} (ucx: libucx-dev; flux: flux-core under /opt/flux-core)"

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [[ -n $unformatted ]]; then
	echo "gofmt would change:" >&2
	echo "$unformatted" >&2
	exit 1
fi
echo "== go vet"
go vet ./...
if [[ -n $DYADFS_TAGS ]]; then
	go vet -tags "$DYADFS_TAGS" ./...
	# The stubs of the backends, as a build without them has them.
	echo "== go test (without $DYADFS_TAGS)"
	go test -count=1 ./flux/... ./dtl/ucx/... ./cmd/...
fi
echo "== go test -race${DYADFS_TAGS:+ -tags $DYADFS_TAGS}"
# A failure's own lines can be far above the end of a long run (a failing
# cluster test prints its daemons' logs): they are repeated last.
# The report (scripts/testreport) keeps a passing test's output out of the
# log and ends with the slowest tests, so that the suite's time stays in
# view.
testlog=$(mktemp)
testreport=$(mktemp)
trap 'rm -f "$testlog" "$testreport"' EXIT
go build -o "$testreport" ./scripts/testreport
if ! go test -json -race -tags "$DYADFS_TAGS" -count=1 -timeout 60m ./... 2>&1 | "$testreport" | tee "$testlog"; then
	echo "== what failed (repeated from above)" >&2
	grep -E '^\s*--- FAIL|^(FAIL|panic:|fatal error:)|^\s+[A-Za-z0-9_]+\.go:[0-9]+: ' "$testlog" |
		grep -v -E ' (log|logs|output):$' | cut -c1-400 | tail -n 80 >&2
	exit 1
fi
if [[ ,$DYADFS_TAGS, == *,ucx,* ]]; then
	# The UCX transport once more with cgo's full pointer checks (every
	# store of a Go pointer into C memory is checked, not only the
	# arguments of calls).
	echo "== go test, UCX transport, GOEXPERIMENT=cgocheck2"
	GOEXPERIMENT=cgocheck2 go test -tags ucx -count=1 -timeout 20m ./dtl/ucx/
fi

# A test binary killed by its timeout cannot run its cleanups: report what
# it left, then remove it, so that the machine is clean either way. The
# tests name what they make: mounts and daemons under the test binaries'
# temporary directories, network namespaces "dy<hex>...", etcd data in
# /dev/shm/dyadfs-test-* and /dev/shm/dyadfs-etcdtest-*.
echo "== leftovers"
leftover=0
tmp=${TMPDIR:-/tmp}
# Mounts under the tests' directories (dyadfs, and the bind mounts that
# hold the nodes' mount namespaces), deepest first.
while read -r mnt; do
	echo "a mount was left behind: $mnt" >&2
	fusermount3 -u -z "$mnt" 2>/dev/null || umount -l "$mnt" || true
	leftover=1
done < <(awk -v t="$tmp/Test" 'index($5, t) == 1 {print length($5), $5}' /proc/self/mountinfo | sort -rn | cut -d' ' -f2-)
for pattern in "dyadfs mount .*--backing $tmp/Test" "etcd .*--data-dir /dev/shm/dyadfs-test-" "etcd .*--data-dir /dev/shm/dyadfs-etcdtest-" "flux-broker.*$tmp/Test"; do
	if pgrep -f -- "$pattern" >/dev/null; then
		echo "processes were left behind:" >&2
		pgrep -a -f -- "$pattern" >&2
		pkill -KILL -f -- "$pattern" || true
		leftover=1
	fi
done
for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^dy[0-9a-f][0-9a-f][0-9a-f][0-9a-f]/ {print $1}'); do
	echo "a network namespace was left behind: $ns" >&2
	ip netns del "$ns" || true
	leftover=1
done
for d in /dev/shm/dyadfs-test-* /dev/shm/dyadfs-etcdtest-*; do
	[[ -e $d ]] || continue
	echo "etcd data was left behind: $d" >&2
	rm -rf "$d"
	leftover=1
done
if ((leftover)); then
	exit 1
fi
echo "all tests passed"
