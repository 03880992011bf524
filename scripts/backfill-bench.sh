#!/usr/bin/env bash
# backfill-bench.sh: spate backfill end to end against an awk baseline.
#
# Generates the corpus of issue 17 deterministically (300 files, 273,864
# lines, 47.1 MiB; scripts/gencorpus), then, RUNS rounds of:
#
#   awk       mawk/awk adds the same "path:offset<TAB>" prefix to every line
#             into one output file, then `sync FILE` (one fsync);
#   1 worker  spate backfill with the default (embedded etcd) store;
#   3 workers three spate backfill processes started together against one
#             embedded store (same --data-dir and --embed-addr: the first
#             hosts it, the others join).
#
# With BEFORE=REV the spate cases also run a binary built from git
# revision REV, interleaved with this tree's in every round, so that both
# meet the same machine load.
#
# For spate it prints, from the workers' --history files:
#   wall   launch to the exit of every worker (startup, planning, copy,
#          the verification of the output, shutdown);
#   first  launch to the first split gained by any worker;
#   copy   the first split gained to the last split committed completed
#          (the copy phase: every line read, written, fsynced, committed).
# and the medians over the rounds. Every spate run must exit 0 (its built-in
# verification checks that every input line reached --dst).
#
# Usage (from anywhere in the repository):
#   scripts/backfill-bench.sh
#   BEFORE=main RUNS=5 scripts/backfill-bench.sh
# Environment:
#   RUNS=3            rounds
#   BEFORE=REV        also measure a build of git revision REV
#   SPATE_BIN=PATH    the spate binary (default: built from this tree)
#   BEFORE_BIN=PATH   the "before" binary (instead of building BEFORE)
#   SPATE_FLAGS=...   extra flags for every spate backfill
#   WORK=DIR          work directory, kept (default: a new temporary one,
#                     removed at the end unless KEEP=1)
#   PORT=23950        embedded etcd client port (PORT+10 is its peer port)
set -euo pipefail

RUNS=${RUNS:-3}
PORT=${PORT:-23950}
SPATE_FLAGS=${SPATE_FLAGS:-}
root=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/spate-bench-XXXXXX")}
mkdir -p "$work"
if [[ -z ${KEEP:-} && -z ${WORK:-} ]]; then
	trap 'rm -rf "$work"' EXIT
fi
AWK=$(command -v mawk || command -v awk)

now() { date +%s.%N; }
sub() { echo "$1 $2" | "$AWK" '{ printf "%.3f", $1 - $2 }'; }

if [[ -z ${SPATE_BIN:-} ]]; then
	SPATE_BIN=$work/spate
	(cd "$root" && go build -o "$SPATE_BIN" ./cmd/spate)
fi
variants=(spate)
bins=("$SPATE_BIN")
if [[ -n ${BEFORE:-} && -z ${BEFORE_BIN:-} ]]; then
	rm -rf "$work/before-src"
	mkdir -p "$work/before-src"
	git -C "$root" archive "$BEFORE" | tar -x -C "$work/before-src"
	BEFORE_BIN=$work/spate-before
	(cd "$work/before-src" && go build -o "$BEFORE_BIN" ./cmd/spate)
fi
if [[ -n ${BEFORE_BIN:-} ]]; then
	variants=(before after)
	bins=("$BEFORE_BIN" "$SPATE_BIN")
fi
corpus=$work/corpus
if [[ ! -d $corpus ]]; then
	(cd "$root" && go run ./scripts/gencorpus -dir "$corpus") >"$work/corpus.txt"
fi
sync # the corpus's writeback must not compete with the runs' fsyncs
lines=$(find "$corpus" -type f -exec cat {} + | wc -l)
echo "corpus: $(cat "$work/corpus.txt") in $corpus"
echo "spate:  $SPATE_BIN ($(git -C "$root" describe --always --dirty 2>/dev/null || echo "?"))"
[[ -z ${BEFORE_BIN:-} ]] || echo "before: $BEFORE_BIN (${BEFORE:-given})"
echo "machine: $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)"

# phases HIST_GLOB LAUNCH: prints "first copy" (seconds) from the history
# files: the first gained split, the last completed commit.
phases() {
	local launch=$2
	# shellcheck disable=SC2086
	cat $1 | "$AWK" -v launch="$launch" '
	function civil(y, m, d,    era, yoe, doy, doe) { # days since 1970-01-01
		y -= (m <= 2); era = int(y / 400); yoe = y - era * 400
		doy = int((153 * (m + (m > 2 ? -3 : 9)) + 2) / 5) + d - 1
		doe = yoe * 365 + int(yoe / 4) - int(yoe / 100) + doy
		return era * 146097 + doe - 719468
	}
	function epoch(ts,    s) { # 2026-12-01T14:30:03.408705124Z
		s = substr(ts, 18); sub(/Z$/, "", s)
		return civil(substr(ts, 1, 4) + 0, substr(ts, 6, 2) + 0, substr(ts, 9, 2) + 0) * 86400 \
			+ substr(ts, 12, 2) * 3600 + substr(ts, 15, 2) * 60 + s
	}
	{
		match($0, /"ts":"[^"]*"/); t = epoch(substr($0, RSTART + 6, RLENGTH - 7))
		if ($0 ~ /"ev":"gained"/ && (first == "" || t < first)) first = t
		if ($0 ~ /"ev":"commit"/ && $0 ~ /"completed":true/ && $0 ~ /"outcome":"ok"/ && t > last) last = t
	}
	END {
		if (first == "" || last == "") { print "? ?"; exit }
		printf "%.3f %.3f\n", first - launch, last - first
	}'
}

# run_spate BIN N RUNDIR: N workers started together; prints "wall first copy".
run_spate() {
	local bin=$1 n=$2 dir=$3 i pids=() rc=0
	rm -rf "$dir"
	mkdir -p "$dir"
	local start
	start=$(now)
	for ((i = 1; i <= n; i++)); do
		# shellcheck disable=SC2086
		"$bin" backfill --src "$corpus" --dst "$dir/out" --data-dir "$dir/etcd" \
			--embed-addr "127.0.0.1:$PORT" --instance "w$i" --history "$dir/w$i.history" \
			$SPATE_FLAGS >"$dir/w$i.log" 2>&1 &
		pids+=($!)
	done
	for i in "${!pids[@]}"; do
		if ! wait "${pids[$i]}"; then
			rc=1
			echo "worker w$((i + 1)) failed; its log:" >&2
			tail -20 "$dir/w$((i + 1)).log" >&2
		fi
	done
	local end
	end=$(now)
	[[ $rc == 0 ]] || return 1
	grep -qE "verified( exactly once)?: all" "$dir"/w*.log || {
		echo "no worker verified the output" >&2
		return 1
	}
	echo "$(sub "$end" "$start") $(phases "$dir/w*.history" "$start")"
}

# run_awk DIR: prints the seconds of awk plus the fsync of its output.
run_awk() {
	local dir=$1 start end
	rm -rf "$dir"
	mkdir -p "$dir"
	(cd "$corpus" && find . -type f | sed 's|^\./||' | LC_ALL=C sort) >"$dir/files"
	start=$(now)
	(cd "$corpus" && xargs "$AWK" 'FNR == 1 { off = 0 } { print FILENAME ":" off "\t" $0; off += length($0) + 1 }' \
		<"$dir/files" >"$dir/out")
	sync "$dir/out"
	end=$(now)
	[[ $(wc -l <"$dir/out") == "$lines" ]] || {
		echo "awk output is short" >&2
		return 1
	}
	sub "$end" "$start"
}

median() { sort -g | "$AWK" '{ v[NR] = $1 } END { if (NR == 0) print "?"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

hdr='%-5s %-6s %6s | %7s %7s %7s | %7s %7s %7s\n'
printf "\n$hdr" round binary awk 1w-wall 1w-first 1w-copy 3w-wall 3w-first 3w-copy
for v in "${variants[@]}"; do : >"$work/results-$v"; done
for ((r = 1; r <= RUNS; r++)); do
	a=$(run_awk "$work/awk")
	for i in "${!variants[@]}"; do
		v=${variants[$i]}
		one=$(run_spate "${bins[$i]}" 1 "$work/one-$v")
		three=$(run_spate "${bins[$i]}" 3 "$work/three-$v")
		read -r w1 f1 c1 <<<"$one"
		read -r w3 f3 c3 <<<"$three"
		echo "$a $w1 $f1 $c1 $w3 $f3 $c3" >>"$work/results-$v"
		printf "$hdr" "$r" "$v" "$a" "$w1" "$f1" "$c1" "$w3" "$f3" "$c3"
	done
done
echo
ratios=
for v in "${variants[@]}"; do
	meds=()
	for col in 1 2 3 4 5 6 7; do
		meds+=("$(cut -d' ' -f$col "$work/results-$v" | median)")
	done
	printf "$hdr" median "$v" "${meds[@]}"
	ratios+=$("$AWK" -v v="$v" -v a="${meds[0]}" -v c1="${meds[3]}" -v c3="${meds[6]}" 'BEGIN {
		printf "%s: copy phase / awk (medians): 1 worker %.1fx, 3 workers %.1fx\\n", v, c1 / a, c3 / a }')
done
echo
printf "$ratios"
echo
echo "seconds; awk = awk + fsync of its output; first = launch to the first split gained;"
echo "copy = first split gained to the last split committed completed (the copy phase)."
