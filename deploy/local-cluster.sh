#!/usr/bin/env bash
# Start a local streamwal cluster on one machine, secured with NATS users:
# three nats-servers forming a JetStream cluster (deploy/nats-{1,2,3}.conf),
# two streamwal coordinators and three streamwal nodes, every stream and
# bucket at 3 replicas. It waits until every PChannel is served, prints how
# to use the cluster, and stops everything on Ctrl-C (or when it is
# terminated). See README.md, "Deployment".
#
# Usage: deploy/local-cluster.sh [BASE]
#
#   BASE                   directory for everything (default ./streamwal-cluster,
#                          or $STREAMWAL_BASE): auth/ (credentials), data/ (the
#                          servers' JetStream files), state/ (the nodes' IDs),
#                          logs/. Run the script again on it to start the same
#                          cluster with its data.
#   STREAMWAL_BIN          the streamwal command (default: streamwal on PATH, else
#                          built from this repository with go into BASE/bin)
#   NATS_SERVER            the nats-server command (default: nats-server on PATH,
#                          else $(go env GOPATH)/bin/nats-server)
#   STREAMWAL_PCHANNELS    PChannels of a new cluster (default 16)
#   STREAMWAL_PORT_OFFSET  added to every port of the configurations (client
#                          4222-4224, routes 6222-6224, monitoring 8222-8224) to
#                          run beside something that uses them (default 0)
set -euo pipefail

if [[ ${1:-} == -h || ${1:-} == --help ]]; then
	# The comment at the top of this file, without its '#'.
	sed -n '2,/^set -euo pipefail$/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
	exit 0
fi

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
base=${1:-${STREAMWAL_BASE:-./streamwal-cluster}}
pchannels=${STREAMWAL_PCHANNELS:-16}
offset=${STREAMWAL_PORT_OFFSET:-0}
cluster=local
ready_timeout=120 # seconds to wait for each stage

say() { printf 'local-cluster: %s\n' "$*"; }
die() { printf 'local-cluster: error: %s\n' "$*" >&2; exit 1; }

# find_nats_server sets nats_server, or says how to install it.
find_nats_server() {
	nats_server=${NATS_SERVER:-}
	if [[ -z $nats_server ]]; then
		nats_server=$(command -v nats-server || true)
	fi
	if [[ -z $nats_server ]] && command -v go >/dev/null && [[ -x "$(go env GOPATH)/bin/nats-server" ]]; then
		nats_server="$(go env GOPATH)/bin/nats-server"
	fi
	if [[ -z $nats_server || ! -x $nats_server ]]; then
		die "nats-server not found${NATS_SERVER:+ at NATS_SERVER=$NATS_SERVER}. Install it with
    go install github.com/nats-io/nats-server/v2@v2.15.2
(it lands in \$(go env GOPATH)/bin, which this script also looks in), or set
NATS_SERVER=/path/to/nats-server."
	fi
}

# find_streamwal sets streamwal, building it from the repository if needed.
find_streamwal() {
	streamwal=${STREAMWAL_BIN:-$(command -v streamwal || true)}
	if [[ -n $streamwal ]]; then
		[[ -x $streamwal ]] || die "STREAMWAL_BIN=$streamwal is not an executable"
		return
	fi
	command -v go >/dev/null || die "streamwal not found on PATH and no go to build it: set STREAMWAL_BIN"
	say "building streamwal into $base/bin"
	(cd "$here/.." && go build -o "$base/bin/streamwal" ./cmd/streamwal)
	streamwal=$base/bin/streamwal
}

# The processes started, in the order they stop: nodes, coordinators,
# servers.
declare -a pids=() names=()

# start NAME DIR COMMAND...: runs COMMAND in DIR in the background, its
# output in logs/NAME.log, in a process group of its own (set -m), so that
# Ctrl-C reaches this script only and it stops the processes in order.
start() {
	local name=$1 dir=$2 pid
	shift 2
	set -m
	(cd "$dir" && exec "$@") </dev/null >"$base/logs/$name.log" 2>&1 &
	pid=$!
	set +m
	pids=("$pid" ${pids[@]+"${pids[@]}"})
	names=("$name" ${names[@]+"${names[@]}"})
	say "started $name (pid $pid): $*"
}

# stop_all ends every process started (SIGTERM: each stops gracefully) and
# waits for them, newest first (nodes, then coordinators, then servers); a
# process still running after 30 s is killed.
stop_all() {
	local i
	trap '' INT TERM HUP # a second Ctrl-C must not cut the stop short
	for i in "${!pids[@]}"; do
		if kill -0 "${pids[$i]}" 2>/dev/null; then
			kill -TERM "${pids[$i]}" 2>/dev/null || true
			wait_gone "${pids[$i]}" "${names[$i]}"
		fi
		wait "${pids[$i]}" 2>/dev/null || true
	done
	pids=()
}

# wait_gone PID NAME: waits up to 30 s for PID to end, then kills it.
wait_gone() {
	local pid=$1 name=$2 n
	for ((n = 0; n < 300; n++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	say "$name (pid $pid) still runs 30 s after SIGTERM: killing it"
	kill -KILL "$pid" 2>/dev/null || true
}

# on_exit stops everything when the script ends, however it ends.
on_exit() {
	local rc=$?
	if ((${#pids[@]} > 0)); then
		say "stopping (logs in $base/logs)"
		stop_all
		say "stopped"
	fi
	exit "$rc"
}

# check_alive fails if a process started has ended, showing its log.
check_alive() {
	local i
	for i in "${!pids[@]}"; do
		if ! kill -0 "${pids[$i]}" 2>/dev/null; then
			say "${names[$i]} (pid ${pids[$i]}) exited; the end of $base/logs/${names[$i]}.log:" >&2
			tail -n 20 "$base/logs/${names[$i]}.log" >&2 || true
			exit 1
		fi
	done
}

# wait_for WHAT INTERVAL COMMAND...: runs COMMAND every INTERVAL seconds
# until it succeeds, while every process runs, for at most ready_timeout
# seconds.
wait_for() {
	local what=$1 interval=$2 deadline=$((SECONDS + ready_timeout))
	shift 2
	until "$@" >/dev/null 2>&1; do
		check_alive
		((SECONDS < deadline)) || die "$what: not after ${ready_timeout} s (logs in $base/logs)"
		sleep "$interval"
	done
}

# running NAME: the process NAME printed its line saying it runs.
running() {
	grep -q ' running on ' "$base/logs/$1.log"
}

# http_ok PORT PATH: an HTTP GET of 127.0.0.1:PORT/PATH answers 200 (bash's
# /dev/tcp, so that no curl is needed).
http_ok() {
	(
		exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
		printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
		IFS= read -r -t 5 reply <&3 || exit 1
		[[ $reply == *" 200 "* ]]
	)
}

# all_served: streamwal status shows every PChannel served and three nodes
# (a status reads every stream's tail: it is asked every 2 s, not more).
all_served() {
	local out
	out=$("$streamwal" status "${client_flags[@]}" --timeout 5s) || return 1
	grep -q '^serving: *all ' <<<"$out" || return 1
	[[ $(grep '^nodes:' <<<"$out" | tr ',' '\n' | wc -l) -eq 3 ]]
}

find_nats_server
mkdir -p "$base"
base=$(cd "$base" && pwd)
find_streamwal
mkdir -p "$base/logs" "$base/state" "$base/data"
trap on_exit EXIT
trap 'exit 0' INT TERM HUP # Ctrl-C, SIGTERM, a closed terminal: on_exit stops everything

# Credentials: one nkey user per role, written once and kept.
if [[ -f $base/auth/auth.conf ]]; then
	say "using the credentials in $base/auth"
else
	"$streamwal" auth init --dir "$base/auth" --cluster "$cluster" --pchannels "$pchannels"
fi

# The servers, from the example configurations (copied next to auth/, which
# they include), on ports shifted by the offset.
servers=()
routes=nats-route://127.0.0.1:$((6222 + offset)),nats-route://127.0.0.1:$((6223 + offset)),nats-route://127.0.0.1:$((6224 + offset))
for i in 1 2 3; do
	cp "$here/nats-$i.conf" "$base/nats-$i.conf"
	ports=()
	if ((offset != 0)); then
		ports=(--port $((4221 + i + offset)) --http_port $((8221 + i + offset))
			--cluster nats://127.0.0.1:$((6221 + i + offset)) --routes "$routes")
	fi
	start "nats-$i" "$base" "$nats_server" -c "nats-$i.conf" ${ports[@]+"${ports[@]}"}
	servers+=("nats://127.0.0.1:$((4221 + i + offset))")
done
urls=$(IFS=,; echo "${servers[*]}")
for i in 1 2 3; do
	wait_for "nats-$i's JetStream (http://127.0.0.1:$((8221 + i + offset))/healthz)" 0.5 http_ok $((8221 + i + offset)) /healthz
done
say "the JetStream cluster of nats-1, nats-2 and nats-3 is up"

# Two coordinators (one active, one standby), then three nodes, each with
# its role's seed; the nodes keep their IDs in their state directories.
# Each coordinator creates the cluster's buckets if they are missing; the
# nodes start once the buckets exist.
for i in 1 2; do
	start "coord-$i" "$base" "$streamwal" coord --server "$urls" --nkey "$base/auth/coord.nk" --cluster "$cluster" \
		--id "coord-$i" --replicas 3 --pchannels "$pchannels"
	wait_for "coord-$i running" 0.5 running "coord-$i"
done
for i in 1 2 3; do
	start "node-$i" "$base" "$streamwal" node --server "$urls" --nkey "$base/auth/node.nk" --cluster "$cluster" \
		--id "node-$i" --state-dir "$base/state/node-$i" --replicas 3
done
for i in 1 2 3; do
	wait_for "node-$i running" 0.5 running "node-$i"
done
client_flags=(--server "$urls" --nkey "$base/auth/client.nk" --cluster "$cluster")
wait_for "every PChannel served by three nodes" 2 all_served

cat <<EOF

streamwal cluster "$cluster" is serving on a local three-server NATS cluster ($pchannels PChannels, 3 replicas).
Use it from another terminal:
  export STREAMWAL_SERVER=$urls
  export STREAMWAL_NKEY=$base/auth/client.nk
  $streamwal status
  $streamwal collection create --db shop --name orders --id 1 --shards 2
  $streamwal append --vchannel pchan-0_1v0 hello
  $streamwal tail --vchannel pchan-0_1v0 --from-start --limit 3
The nats CLI, as admin: nats --server $urls --nkey $base/auth/admin.nk stream ls
Monitoring: http://127.0.0.1:$((8222 + offset))/jsz (and ports $((8223 + offset)), $((8224 + offset)))
Processes, logs in $base/logs (kill one to watch its work move; to restart it, run
its command from the "started" line above in $base: a process started by hand is
yours to stop):
EOF
for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
	printf '  %-7s pid %s\n' "${names[$i]}" "${pids[$i]}"
done
echo "Press Ctrl-C to stop everything."

# Run until told to stop; a process that dies is the user's experiment, not
# a reason to stop the others.
while true; do
	sleep 1 &
	wait $! || true
done
