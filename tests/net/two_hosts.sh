#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Encoder-cache transfer between two "hosts": two network namespaces joined by a veth pair,
# a consumer (2 shards) in one and producers in the other, data plane over UCX tcp.
#   1. 40 items of 1 KiB - 4 MiB pushed and checked byte for byte on both shards;
#   2. the link cut in the middle of a run of pushes and restored: pushes in flight fail (the
#      producer says so and goes on), nothing corrupt arrives, the reservations of failed
#      pushes are abandoned or reaped at their TTL, and the next producer is served in full.
# Needs root and iproute2 (CI runs as root); anywhere else it exits 77 (skipped) saying why.
# Usage: two_hosts.sh path/to/kvtier
set -uo pipefail
KVTIER=${1:?usage: two_hosts.sh path/to/kvtier}
A=kvt-a-$$ B=kvt-b-$$ VA=kvta$$ VB=kvtb$$
IPA=10.77.$(( $$ % 200 )).1 IPB=10.77.$(( $$ % 200 )).2
PORT=19000
LOG=
export UCX_TLS=tcp KVTIER_LOG=error

skip() { echo "two_hosts: skipped: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "needs iproute2 (ip)"
ip netns add "$A" 2>/dev/null || skip "cannot create a network namespace here"

cleanup() {
  [ -n "${CONS:-}" ] && kill "$CONS" 2>/dev/null
  ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null
}
trap cleanup EXIT
fail() { echo "two_hosts: FAILED: $*"; [ -n "$LOG" ] && [ -f "$LOG" ] && cat "$LOG"; exit 1; }
. "$(dirname "$0")/wait.sh"

ip netns add "$B" || fail "netns $B"
ip link add "$VA" type veth peer name "$VB" || fail "veth"
ip link set "$VA" netns "$A" && ip link set "$VB" netns "$B" || fail "moving the veth ends"
ip -n "$A" addr add "$IPA/24" dev "$VA" && ip -n "$B" addr add "$IPB/24" dev "$VB" || fail "addresses"
ip -n "$A" link set lo up && ip -n "$B" link set lo up
ip -n "$A" link set "$VA" up && ip -n "$B" link set "$VB" up || fail "links up"

LOG=$(mktemp)
ip netns exec "$A" "$KVTIER" ec-consumer --host "$IPA" --port $PORT --shards 2 --ttl 4 \
  --buffer-mib 64 >"$LOG" 2>&1 &
CONS=$!
wait_for "the consumer did not start" grep -q "control ports" "$LOG"

# 1. a clean run across the link
ip netns exec "$B" "$KVTIER" ec-producer --consumer "tcp://$IPA:$PORT" --items 40 --seed 1 \
  --max-kib 4096 --timeout-ms 3000 || fail "the clean run failed"
echo "two_hosts: 40 items pushed across the veth link"

# 2. cut the link while pushes run, restore it
ip netns exec "$B" "$KVTIER" ec-producer --consumer "tcp://$IPA:$PORT" --items 400 --seed 2 \
  --max-kib 4096 --timeout-ms 1500 >/tmp/kvt-cut-$$.log 2>&1 &
PROD=$!
sleep 0.5
ip -n "$B" link set "$VB" down
sleep 2
ip -n "$B" link set "$VB" up
wait $PROD
echo "two_hosts: during the cut: $(grep -c 'failed:' /tmp/kvt-cut-$$.log) pushes failed; $(tail -1 /tmp/kvt-cut-$$.log)"
rm -f /tmp/kvt-cut-$$.log

# failed pushes' reservations: abandoned by the producer or reaped after the 4 s TTL
sleep 6
ip netns exec "$B" "$KVTIER" ec-producer --consumer "tcp://$IPA:$PORT" --items 40 --seed 3 \
  --max-kib 4096 --timeout-ms 3000 || fail "the producer after the cut was not served"
echo "two_hosts: the next producer was served in full"

kill -TERM "$CONS"; wait "$CONS"; RC=$?; CONS=
SUMMARY=$(grep "ec-consumer: done" "$LOG")
echo "two_hosts: $SUMMARY"
[ $RC -eq 0 ] || fail "the consumer exited $RC"
echo "$SUMMARY" | grep -q " 0 corrupt" || fail "corrupt items arrived"
echo "$SUMMARY" | grep -q " 0 writers active at exit" || fail "writers still active at the end"
rm -f "$LOG"
echo "two_hosts: passed"
