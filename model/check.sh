#!/usr/bin/env bash
# Model-checks the Promela models of this directory with spin: each correct
# model must pass, and each seeded bug must be caught (a model that cannot
# fail proves nothing). Needs spin (Debian: apt-get install spin) and a C
# compiler. Usage: model/check.sh [work dir]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${1:-$(mktemp -d)}
mkdir -p "$work"
cd "$work"

# run NAME EXPECT MODEL [spin -D flags...] -- [pan flags...]
run() {
	local name=$1 expect=$2 model=$3
	shift 3
	local defs=() pan=()
	while [ $# -gt 0 ] && [ "$1" != "--" ]; do defs+=("$1"); shift; done
	[ $# -gt 0 ] && shift
	pan=("$@")
	cp "$here/$model" .
	spin -a "${defs[@]}" "$model" >/dev/null
	local cflags=(-O2 -w)
	if printf '%s\n' "${pan[@]}" | grep -q -- '^-a$'; then cflags+=(-DNFAIR=4); else cflags+=(-DSAFETY); fi
	gcc "${cflags[@]}" -o pan pan.c
	local out errors
	out=$(./pan -m200000 "${pan[@]}" 2>&1 || true)
	errors=$(printf '%s\n' "$out" | sed -n 's/.*errors: \([0-9]*\).*/\1/p' | tail -1)
	if [ -z "$errors" ]; then
		printf '%s\n' "$out"; echo "FAIL $name: pan did not finish"; return 1
	fi
	if [ "$expect" = pass ] && printf '%s\n' "$out" | grep -q "max search depth too small"; then
		echo "FAIL $name: search depth too small: the check is incomplete"; return 1
	fi
	local states
	states=$(printf '%s\n' "$out" | sed -n 's/^ *\([0-9e.+]*\) states, stored.*/\1/p' | head -1)
	if { [ "$expect" = pass ] && [ "$errors" != 0 ]; } || { [ "$expect" = fail ] && [ "$errors" = 0 ]; }; then
		printf '%s\n' "$out" | head -20
		echo "FAIL $name: expected to $expect, pan found $errors error(s)"
		return 1
	fi
	echo "ok   $name: ${expect}ed as expected ($errors error(s), ${states:-?} states)"
}

run "lock: mutual exclusion, no deadlock" pass lock.pml --
run "lock: no starvation under weak fairness" pass lock.pml -DLIVE -- -a -f
run "lock: seeded bug (grant while held)" fail lock.pml -DBUG_GRANT_WHILE_HELD --
run "lock: seeded bug (poll without invalidate)" fail lock.pml -DLIVE -DBUG_NO_INVALIDATE -- -a -f
run "publish: ready entry means whole payload" pass publish.pml --
run "publish: seeded bug (entry flushed first)" fail publish.pml -DBUG_ENTRY_FIRST --
run "publish: seeded bug (reader keeps stale payload)" fail publish.pml -DBUG_NO_REFRESH --
run "pin: a pinned entry's payload is never replaced" pass pin.pml --
run "pin: seeded bug (reader checks before pinning)" fail pin.pml -DBUG_CHECK_FIRST --
run "pin: seeded bug (evictor scans before marking)" fail pin.pml -DBUG_SCAN_FIRST --
run "pin: seeded bug (pin left in the reader's cache)" fail pin.pml -DBUG_PIN_NOT_FLUSHED --
run "pin: seeded bug (high-water mark raised after the check)" fail pin.pml -DBUG_MARK_LATE --
run "pin: seeded bug (high-water mark left in the reader's cache)" fail pin.pml -DBUG_MARK_NOT_FLUSHED --
run "pin: seeded bug (reader writes the entry's line)" fail pin.pml -DBUG_READER_STAMPS --
run "pin batch (TSO): one fence a batch keeps a pinned payload" pass pin_batch.pml --
run "pin batch (TSO): seeded bug (no fence before the re-check)" fail pin_batch.pml -DBUG_NO_FENCE --
run "pin batch (TSO): seeded bug (re-check before the pins)" fail pin_batch.pml -DBUG_CHECK_FIRST --
run "pin batch (TSO): seeded bug (pin released before the read)" fail pin_batch.pml -DBUG_RELEASE_EARLY --
run "pin batch (TSO): seeded bug (evictor scans before marking)" fail pin_batch.pml -DBUG_SCAN_FIRST --
echo "models OK"
