# SPDX-License-Identifier: Apache-2.0
# Sourced by the two-host scripts (they define fail).
# wait_for WHAT CMD...: runs CMD until it succeeds, under the tests' one deadline
# (KVTIER_TEST_DEADLINE_S, default 60 s), never a count of tries; past it, fails saying WHAT
wait_for() {
  local what=$1 d=${KVTIER_TEST_DEADLINE_S:-60}; shift
  local end=$(( $(date +%s) + ${d%%.*} + 1 ))
  until "$@"; do
    [ "$(date +%s)" -lt "$end" ] || fail "$what"
    sleep 0.05
  done
}
