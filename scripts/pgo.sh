#!/usr/bin/env bash
# pgo.sh regenerates the profile that Go builds of libcxltier (the library
# SGLang loads) and of bench/prefix use for profile-guided optimization
# (cmd/libcxltier/default.pgo; bench/prefix/default.pgo links to it). It
# profiles the prefix store's hot paths: lookups, probes and inserts in
# bench/prefix's worker processes, HiCache's batch_exists and the block
# copy in the prefix package's benchmarks. Run it on an idle machine after
# changes to those paths; a stale profile still builds, it just helps less.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "pgo: profiling bench/prefix's ops/s workers..." >&2
go run ./bench/prefix -procs 1,2 -batch 1,32 -runs 1 -duration 2s -move-blocks 0 -redis '' \
	-rounds 1 -tokens 16 -cpuprofile "$tmp/ops" -out "$tmp/ops.json" >/dev/null
echo "pgo: profiling batch_exists and the block copy..." >&2
go test ./prefix -run '^$' -bench 'ExistsPages|CopyCRC' -benchtime 2s -o "$tmp/prefix.test" \
	-cpuprofile "$tmp/bench.pprof" >/dev/null
go tool pprof -proto "$tmp"/ops/*.pprof "$tmp/bench.pprof" >"$tmp/merged.pgo" 2>/dev/null
mv "$tmp/merged.pgo" cmd/libcxltier/default.pgo
echo "pgo: wrote cmd/libcxltier/default.pgo ($(wc -c <cmd/libcxltier/default.pgo) bytes)" >&2
