#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The remote tier between three "hosts": network namespaces joined by a bridge over veth
# links. Host D runs Redis (started here), hosts A and B run `kvtier remote-peer` instances;
# data plane over UCX tcp. Every block read is checked byte for byte by the reader.
#   1. hits across hosts, both ways;
#   2. the owner killed while a reader loads from it again and again: reads fail or miss,
#      none is corrupt, the reader does not hang, and once the owner's key expired nothing
#      of it is found;
#   3. the owner restarted under its name: a new epoch, empty; its old blocks are not found,
#      what it stores anew is;
#   4. Redis restarted: lookups miss meanwhile (no error), then the owner enters again and
#      publishes what it holds, and the reader finds it;
#   5. an instance with another hash seed is refused, naming the live instance.
# Needs root, iproute2 and redis-server (CI has them); anywhere else it exits 77 (skipped).
# Usage: remote_hosts.sh path/to/kvtier
set -uo pipefail
KVTIER=${1:?usage: remote_hosts.sh path/to/kvtier}
P=$$
NS_D=kvr-d-$P NS_A=kvr-a-$P NS_B=kvr-b-$P BR=kvrbr$P
NET=10.78.$(( P % 200 ))
IP_D=$NET.1 IP_A=$NET.2 IP_B=$NET.3
RPORT=6390
export UCX_TLS=tcp KVTIER_LOG=error KVTIER_REMOTE_CREDENTIAL=remote-hosts-test-credential
LOGS=$(mktemp -d)
PIDS=()

skip() { echo "remote_hosts: skipped: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "needs iproute2 (ip)"
command -v redis-server >/dev/null || skip "needs redis-server (scripts/install-deps)"
ip netns add "$NS_D" 2>/dev/null || skip "cannot create a network namespace here"

cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  ip netns del "$NS_D" 2>/dev/null; ip netns del "$NS_A" 2>/dev/null
  ip netns del "$NS_B" 2>/dev/null; ip link del "$BR" 2>/dev/null
  rm -rf "$LOGS"
}
trap cleanup EXIT
fail() { echo "remote_hosts: FAILED: $*"; for f in "$LOGS"/*.log; do echo "--- $f"; tail -20 "$f"; done; exit 1; }

# three hosts on one bridge (in this namespace), a veth link each
ip link add "$BR" type bridge && ip link set "$BR" up || fail "bridge"
for h in D A B; do
  ns_var=NS_$h ip_var=IP_$h
  ns=${!ns_var} ipa=${!ip_var}
  [ "$h" = D ] || ip netns add "$ns" || fail "netns $ns"
  ip link add "kvr$h$P" type veth peer name "kvr${h}p$P" || fail "veth $h"
  ip link set "kvr${h}p$P" netns "$ns" && ip link set "kvr$h$P" master "$BR" up || fail "link $h"
  ip -n "$ns" addr add "$ipa/24" dev "kvr${h}p$P" && ip -n "$ns" link set "kvr${h}p$P" up &&
    ip -n "$ns" link set lo up || fail "address $h"
done

. "$(dirname "$0")/wait.sh"

start_redis() {
  ip netns exec "$NS_D" redis-server --bind "$IP_D" --port $RPORT --save "" --appendonly no \
    --protected-mode no >"$LOGS/redis.log" 2>&1 &
  REDIS=$!
  PIDS+=("$REDIS")
  wait_for "redis did not start" redis_up
}

redis_up() {
  ip netns exec "$NS_A" redis-cli -h "$IP_D" -p $RPORT ping 2>/dev/null | grep -q PONG
}

# serve NS NAME SEQ [extra options]: starts an owner in NS, waits until it serves
serve() {
  local ns=$1 name=$2 seq=$3; shift 3
  local log="$LOGS/$name-$seq.log"
  ip netns exec "$ns" "$KVTIER" remote-peer --directory "$IP_D:$RPORT" --instance "$name" \
    --listen "$( [ "$ns" = "$NS_A" ] && echo "$IP_A" || echo "$IP_B")" --serve "$seq" \
    --blocks 48 --block-kib 256 --slots 64 --ttl-ms 600 "$@" >"$log" 2>&1 &
  OWNER=$!
  PIDS+=("$OWNER")
  wait_for "$name did not start serving sequence $seq" grep -q serving "$log"
}

# read NS NAME SEQ EXPECT [extra]: looks SEQ up from NS, reads and checks; EXPECT hits
read_seq() {
  local ns=$1 name=$2 seq=$3 expect=$4; shift 4
  ip netns exec "$ns" "$KVTIER" remote-peer --directory "$IP_D:$RPORT" --instance "$name" \
    --listen "$( [ "$ns" = "$NS_A" ] && echo "$IP_A" || echo "$IP_B")" --read "$seq" \
    --blocks 64 --block-kib 256 --timeout-ms 1000 --expect-hits "$expect" "$@"
}

# read_seq without its output, for wait_for
read_seq_quiet() { read_seq "$@" >/dev/null 2>&1; }

start_redis

# 1. hits across hosts, both ways
serve "$NS_A" a 1; A1=$OWNER
serve "$NS_B" b 2; B2=$OWNER
OUT=$(read_seq "$NS_B" rb 1 48) || fail "B reading A's blocks: $OUT"
echo "remote_hosts: $OUT"
OUT=$(read_seq "$NS_A" ra 2 48) || fail "A reading B's blocks: $OUT"
echo "remote_hosts: $OUT"

# 2. the owner killed while B loads from it
read_seq "$NS_B" rb 1 0 --repeat 400 >"$LOGS/during-kill.log" 2>&1 &
RD=$!
sleep 0.4
kill -9 "$A1"; wait "$A1" 2>/dev/null
wait "$RD"
OUT=$(grep "remote-peer: read" "$LOGS/during-kill.log")
echo "remote_hosts: while the owner was killed: $OUT"
echo "$OUT" | grep -q " 0 corrupt" || fail "corrupt blocks while the owner was killed"
[ -n "$OUT" ] || fail "the reader did not finish"
# until the owner's key (600 ms) expired: then its blocks are misses
wait_for "the killed owner's blocks are still found" read_seq_quiet "$NS_B" rb 1 0

# 3. the owner restarted: empty, a new epoch, serves only what it stores anew
serve "$NS_A" a 3; A3=$OWNER
grep -q "epoch 2" "$LOGS/a-3.log" || fail "the restarted owner did not start a new epoch: $(cat "$LOGS/a-3.log")"
OUT=$(read_seq "$NS_B" rb 1 0) || fail "the restarted owner's old blocks are found: $OUT"
OUT=$(read_seq "$NS_B" rb 3 48) || fail "the restarted owner's new blocks: $OUT"
echo "remote_hosts: after the restart: $OUT"

# 4. Redis restarted
{ kill -9 "$REDIS"; wait "$REDIS"; } 2>/dev/null
OUT=$(read_seq "$NS_B" rb 3 0) || fail "with Redis down a lookup must miss, not fail: $OUT"
start_redis
wait_for "after Redis restarted, A's blocks were not found again" read_seq_quiet "$NS_B" rb 3 48
OUT=$(read_seq "$NS_B" rb 3 48) || fail "after Redis restarted: $OUT"
echo "remote_hosts: after Redis restarted: $OUT"

# 5. another hash seed is refused, naming the live instance
OUT=$(ip netns exec "$NS_B" "$KVTIER" remote-peer --directory "$IP_D:$RPORT" --instance c \
  --listen "$IP_B" --seed 99 --read 3 2>&1) && fail "an instance with another seed was admitted"
echo "$OUT" | grep -q "hash seed" || fail "the refusal does not name the seed: $OUT"
echo "remote_hosts: another seed refused: ${OUT#kvtier remote-peer: }"

kill -TERM "$A3" "$B2"; wait "$A3" "$B2" 2>/dev/null
echo "remote_hosts: passed"
