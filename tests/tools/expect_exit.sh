#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# expect_exit.sh STATUS PATTERN COMMAND...: runs COMMAND and passes only if it exits with
# STATUS and its output (stdout and stderr) contains PATTERN (a grep -E pattern). ctest's
# PASS_REGULAR_EXPRESSION alone would ignore the exit status, so a crash or a sanitizer report
# after the expected message could pass.
want=$1
pattern=$2
shift 2
out=$("$@" 2>&1)
got=$?
printf '%s\n' "$out" | tail -n 40
if [ "$got" -ne "$want" ]; then
  echo "expect_exit: exit status $got, expected $want" >&2
  exit 1
fi
if ! printf '%s\n' "$out" | grep -Eq -- "$pattern"; then
  echo "expect_exit: the output does not contain /$pattern/" >&2
  exit 1
fi
exit 0
