#!/usr/bin/env bash
# fleet-bench.sh: how evenly a fleet divides a job. Three spate backfill
# workers, each --rate 10000, on the default (embedded etcd) store copy
# 120,000 lines given as (1) 24 equal files with --split-files 1 (one file a
# split: the reference), (2) the same at the defaults, (3) one file of
# 100,000 lines and 20 of 1,000, at the defaults and (4) with --min-splits 1
# (no plan-time ranges: only runtime division can share the big file);
# wall from the first launch to the last exit, the splits gained and the
# commits made (from --history), and the finish spread: how far apart the
# workers finished, as exit times (first exit to last) and as each worker's
# last completed commit (from its --history; the first worker's last
# completion to the last worker's), in interleaved rounds of two binaries,
# so that both meet the same load. The issue's goal: the straggler finishes
# within one commit interval (backfill's default: 1 s) of the others.
#
# Usage: BEFORE_BIN=old/spate SPATE_BIN=new/spate scripts/fleet-bench.sh
# Environment: RUNS=3 rounds; PORT=24950 embedded etcd client port;
# WORK=DIR work directory (default /tmp/spate-fleet-bench, kept);
# ROWS="skewed --min-splits 1|equal": only these inputs (|-separated, each
# an input directory and its flags); default the four above.
set -euo pipefail
RUNS=${RUNS:-3}; PORT=${PORT:-24950}
work=${WORK:-/tmp/spate-fleet-bench}; mkdir -p "$work"
gen() { # gen DIR NAME LINES
	awk -v n="$3" -v f="$2" 'BEGIN { for (i = 0; i < n; i++) printf "%s line %06d padding padding padding padding %06d\n", f, i, i }' >"$1/$2"
}
if [[ ! -d $work/equal ]]; then
	mkdir -p "$work/equal" "$work/skewed"
	for i in $(seq -w 1 24); do gen "$work/equal" "f$i.log" 5000; done
	gen "$work/skewed" big.log 100000
	for i in $(seq -w 1 20); do gen "$work/skewed" "s$i.log" 1000; done
fi
now() { date +%s.%N; }
run() { # run BIN SRC DIR FLAGS...: prints wall and splits
	local bin=$1 src=$2 dir=$3; shift 3
	rm -rf "$dir"; mkdir -p "$dir"
	local start pids=() rc=0 i
	start=$(now)
	for i in 1 2 3; do
		(
			rc=0
			"$bin" backfill --src "$src" --dst "$dir/out" --data-dir "$dir/etcd" --embed-addr "127.0.0.1:$PORT" \
				--instance "w$i" --history "$dir/w$i.history" --rate 10000 "$@" >"$dir/w$i.log" 2>&1 || rc=$?
			now >"$dir/w$i.exit"
			exit "$rc"
		) &
		pids+=($!)
	done
	for p in "${pids[@]}"; do wait "$p" || rc=1; done
	local end; end=$(now)
	[[ $rc == 0 ]] || { echo "FAILED in $dir" >&2; tail -5 "$dir"/w*.log >&2; return 1; }
	grep -qE "verified( exactly once)?: all" "$dir"/w*.log || { echo "not verified $dir" >&2; return 1; }
	local splits commits
	splits=$(cat "$dir"/w*.history | grep '"ev":"gained"' | grep -o '"split":"[^"]*"' | sort -u | wc -l)
	commits=$(cat "$dir"/w*.history | grep -c '"ev":"commit"')
	local exitspread donespread
	exitspread=$(cat "$dir"/w*.exit | awk 'NR == 1 || $1 < lo { lo = $1 } NR == 1 || $1 > hi { hi = $1 } END { printf "%.2f", hi - lo }')
	donespread=$(for i in 1 2 3; do lastdone "$dir/w$i.history"; done | awk '
		$1 == "" { next } n++ == 0 || $1 < lo { lo = $1 } n == 1 || $1 > hi { hi = $1 }
		END { if (n < 2) print "-"; else printf "%.2f", hi - lo }')
	echo "$(echo "$end $start" | awk '{printf "%.2f", $1-$2}') $splits $commits $exitspread $donespread"
}
# lastdone HISTORY: the time (seconds of the day, UTC) of the worker's last
# commit that completed a split; nothing if it completed none.
lastdone() {
	grep '"ev":"commit"' "$1" | grep '"completed":true' | grep '"outcome":"ok"' | tail -1 |
		sed -E 's/.*"ts":"[0-9-]+T([0-9]+):([0-9]+):([0-9.]+)Z".*/\1 \2 \3/' |
		awk 'NF == 3 { printf "%.3f\n", $1 * 3600 + $2 * 60 + $3 }'
}
printf "%-5s %-7s %-22s %7s %7s %7s %7s %7s\n" round binary input wall splits commits exit-sp done-sp
for r in $(seq 1 "$RUNS"); do
	IFS='|' read -r -a rows <<<"${ROWS:-equal --split-files 1|equal|skewed|skewed --min-splits 1}"
	for input in "${rows[@]}"; do
		set -- $input; src=$work/$1; shift
		for v in before after; do
			bin=$BEFORE_BIN; [[ $v == after ]] && bin=$SPATE_BIN
			out=$(run "$bin" "$src" "$work/run-$v" "$@")
			printf "%-5s %-7s %-22s %7s %7s %7s %7s %7s\n" "$r" "$v" "$input" $out | tee -a "$work/results"
		done
	done
done
echo "exit-sp: first to last worker exit; done-sp: first to last worker's last completed"
echo "commit (- : fewer than two workers completed a split); seconds"
