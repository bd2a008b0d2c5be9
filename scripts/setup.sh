#!/usr/bin/env bash
# Installs what dyadfs needs on a fresh Debian 12 machine, builds dyadfs and
# installs it as /usr/local/bin/dyadfs. Run as root. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

# Debian packages: fuse3 (fusermount3); etcd-server, the metadata store
# shared between nodes, and etcd-client (etcdctl: compact, defrag and
# disarm a full store); python3 and util-linux (unshare, nsenter, setpriv)
# for the tests; iproute2 (ip, tc) for the multi-node tests; iperf3 for the
# benchmark's network baseline; the programs the tests run on the mount
# as users do (rsync, sqlite3, and Debian's python3 with numpy and h5py);
# openssl, whose sha256 the tests use on their 5 GiB files (fast);
# strace, to count what the daemon does for one waiting open; perl and
# gcc for the POSIX conformance suite; pkg-config and libucx-dev for the
# UCX transport (ucx-utils: ucx_info and ucx_perftest, its baselines).
# Below, prometheus for promtool, which checks the metrics the daemon
# serves (without its recommended exporters and services).
packages=()
command -v fusermount3 >/dev/null || packages+=(fuse3)
command -v etcd >/dev/null || packages+=(etcd-server)
command -v etcdctl >/dev/null || packages+=(etcd-client)
command -v python3 >/dev/null || packages+=(python3)
command -v nsenter >/dev/null || packages+=(util-linux)
command -v ip >/dev/null || packages+=(iproute2)
command -v iperf3 >/dev/null || packages+=(iperf3)
command -v rsync >/dev/null || packages+=(rsync)
command -v sqlite3 >/dev/null || packages+=(sqlite3)
command -v strace >/dev/null || packages+=(strace)
command -v openssl >/dev/null || packages+=(openssl)
# perl's prove and a C compiler build and run pjdfstest (../shared).
command -v prove >/dev/null || packages+=(perl)
command -v cc >/dev/null || packages+=(gcc)
command -v pkg-config >/dev/null || packages+=(pkg-config)
[[ -e /usr/include/ucp/api/ucp.h ]] || packages+=(libucx-dev)
command -v ucx_perftest >/dev/null || packages+=(ucx-utils)
/usr/bin/python3 -c 'import numpy, h5py' 2>/dev/null || packages+=(python3-numpy python3-h5py)
if ((${#packages[@]})); then
	if [[ $(id -u) -ne 0 ]]; then
		echo "setup.sh: missing ${packages[*]}; run as root to install them" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-get install -y -qq "${packages[@]}" >/dev/null 2>&1; then
		apt-get update -qq
		apt-get install -y -qq "${packages[@]}"
	fi
fi
if ! command -v promtool >/dev/null && [[ $(id -u) -eq 0 ]]; then
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 ||
		echo "setup.sh: could not install prometheus (promtool); the metrics test will skip its check" >&2
fi

if ! command -v go >/dev/null; then
	echo "setup.sh: Go is not installed (expected at /usr/local/go)" >&2
	exit 1
fi
# The optional backends this machine can build: UCX from Debian, Flux
# where ../shared/flux/install.sh (or a site) put flux-core.
. scripts/buildenv.sh
version=$(git describe --always --dirty 2>/dev/null || echo dev)
mkdir -p bin
go build -tags "$DYADFS_TAGS" -ldflags "-X main.version=$version" -o bin/dyadfs ./cmd/dyadfs
if [[ $(id -u) -eq 0 ]]; then
	install -m 0755 bin/dyadfs /usr/local/bin/dyadfs
	echo "setup.sh: installed /usr/local/bin/dyadfs ($version; backends: tcp${DYADFS_TAGS:+,$DYADFS_TAGS})"
else
	echo "setup.sh: built $(pwd)/bin/dyadfs ($version); run as root to install it"
fi
