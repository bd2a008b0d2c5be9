#!/usr/bin/env bash
# Starts and stops dyadfs on every node of a Flux allocation: one daemon
# next to each broker, the Flux KVS as the store, node ids the ranks.
# Run it inside the allocation (FLUX_URI set), e.g. from the batch script
# of `flux batch` or in `flux alloc`:
#
#   scripts/flux-dyadfs.sh start /mnt/dmd [dyadfs mount flags...]
#   ... the job's steps (flux run ...) use /mnt/dmd on every node ...
#   scripts/flux-dyadfs.sh stop /mnt/dmd [--forget]
#
# start mounts on all ranks and returns once every mount is ready (or
# fails, naming the rank); stop unmounts on all ranks and, with --forget,
# then deletes what the job kept in the KVS. Defaults, each overridable:
#   DYADFS            the dyadfs binary on the nodes (dyadfs, from PATH)
#   DYADFS_BACKING    node-local backing directory (dyadfs's default:
#                     /var/tmp/dyadfs/<namespace>)
#   DYAD_KVS_NAMESPACE the job's namespace (dyadfs-<FLUX_JOB_ID>, or dyadfs)
#   DYAD_DTL_MODE     the transport (FLUX_RPC; or TCP, UCX)
# "{rank}" in the mountpoint, the backing directory or any dyadfs flag
# (--log-file /tmp/dyadfs-{rank}.log) becomes each broker's rank. Where
# several brokers share a machine (flux start --test-size=N) and the
# mountpoint has no {rank}, each mounts at MOUNTPOINT-{rank}, over a
# backing directory of its own: one path cannot hold two mounts.
set -euo pipefail
usage() {
	echo "usage: $0 start MOUNTPOINT [dyadfs mount flags...] | stop MOUNTPOINT [--forget]" >&2
	exit 2
}
(($# >= 2)) || usage
what=$1 mnt=$2
shift 2
if [[ -z ${FLUX_URI:-} ]]; then
	echo "$0: FLUX_URI is not set: run this inside a Flux allocation (flux alloc, flux batch, flux start)" >&2
	exit 1
fi
dyadfs=${DYADFS:-dyadfs}
ns=${DYAD_KVS_NAMESPACE:-dyadfs${FLUX_JOB_ID:+-$FLUX_JOB_ID}}
backing=${DYADFS_BACKING:-}
dtl=${DYAD_DTL_MODE:-FLUX_RPC}

# Brokers that share a machine need paths of their own.
if [[ $mnt != *"{rank}"* ]] && [[ -n $(flux exec -r all hostname | sort | uniq -d) ]]; then
	echo "$0: several brokers share a machine: each mounts at $mnt-{rank} (put {rank} in the mountpoint to choose)" >&2
	mnt="$mnt-{rank}"
	if [[ -z $backing ]]; then
		backing="/var/tmp/dyadfs/$ns-{rank}"
	fi
fi

# on_every_rank runs a shell script next to every broker, with $rank set
# and {rank} replaced in $mnt, $backing and the script's arguments, which
# follow.
on_every_rank() {
	local script=$1
	shift
	flux exec -r all --label-io bash -c '
		rank=$(flux getattr rank)
		mnt=${1//\{rank\}/$rank} backing=${2//\{rank\}/$rank}
		shift 2
		set -- "${@//\{rank\}/$rank}"
		'"$script" bash "$mnt" "$backing" "$@"
}

case $what in
start)
	on_every_rank '
		mkdir -p "$mnt"
		if [[ -n $backing ]]; then
			mkdir -p "$backing"
			set -- "$1" "$2" "$3" --backing "$backing" "${@:4}"
		fi
		exec "$1" mount --store flux:// --namespace "$2" --dtl "$3" "${@:4}" "$mnt"' \
		"$dyadfs" "$ns" "$dtl" "$@" ||
		{
			echo "$0: dyadfs did not start on every rank (see the lines above); stopping the others" >&2
			on_every_rank 'fusermount3 -u "$mnt" 2>/dev/null || true' || true
			exit 1
		}
	where=$mnt
	if [[ $mnt == *"{rank}"* ]]; then
		where="$mnt ({rank}: each broker's rank)"
	fi
	echo "dyadfs: mounted at $where on $(flux getattr size) ranks (namespace $ns, transport $dtl)"
	;;
stop)
	forget=0
	for a in "$@"; do
		case $a in
		--forget) forget=1 ;;
		*) usage ;;
		esac
	done
	# fusermount3 -u ends the daemon, which then finishes what it had
	# started (its last publishes) and exits: wait for it, a minute at
	# most. A mount still in use stays, and its rank is named.
	on_every_rank '
		mountpoint -q "$mnt" || exit 0
		pid=$(sed -n "s/^ *\"pid\": *\([0-9]*\).*/\1/p" "$mnt/.dyadfs/status" 2>/dev/null | head -1)
		fusermount3 -u "$mnt" || exit 1
		for _ in $(seq 600); do
			# Gone, or a zombie its parent has not reaped yet.
			state=$(cut -d" " -f3 "/proc/$pid/stat" 2>/dev/null || true)
			[[ -n $pid && -n $state && $state != Z ]] || exit 0
			sleep 0.1
		done
		echo "dyadfs (pid $pid) has not exited a minute after its unmount" >&2
		exit 1'
	if ((forget)); then
		FLUX_URI=$FLUX_URI "$dyadfs" forget --store flux:// --namespace "$ns"
	fi
	echo "dyadfs: unmounted at $mnt on every rank"
	;;
*) usage ;;
esac
