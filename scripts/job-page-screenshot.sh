#!/usr/bin/env bash
# job-page-screenshot.sh: regenerates docs/images/ui-job.png, the job page
# of a real `spate backfill --follow` run, mid-run.
#
# Builds spate, starts a writer appending lines to four log files at
# different rates, and two `spate backfill --follow` workers sharing the
# job on the embedded etcd, each reading at most --rate lines a second so
# the files fall behind and their lag shows. Halfway it rotates app2.log
# (rename to app2.log.1, a new app2.log), so the page names a file found
# under another name. After RUN seconds (default 40) it takes the page of
# the first worker's view (/ui/ on its --metrics-addr) with headless
# Chromium, then stops everything. Look at the image before committing it:
# it must show the files, their lag and both charts drawn.
#
# Needs Debian's chromium (apt-get install -y chromium; or $CHROMIUM).
# Usage: scripts/job-page-screenshot.sh [OUT.png]
# GO=gt runs the build through another go wrapper; SPATE=PATH uses that
# spate binary instead of building one.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-docs/images/ui-job.png}"
run="${RUN:-40}"
chromium="${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}"
[ -n "$chromium" ] || { echo "no chromium: apt-get install -y chromium, or set CHROMIUM" >&2; exit 1; }

work="$(mktemp -d)"
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

if [ -n "${SPATE:-}" ]; then
	cp "$SPATE" "$work/spate" # a spate binary built already
else
	"${GO:-go}" build -o "$work/spate" ./cmd/spate
fi
mkdir -p "$work/src" "$work/dst"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
etcd="127.0.0.1:$(free_port)"
m1="127.0.0.1:$(free_port)"
m2="127.0.0.1:$(free_port)"

# The writer: appN.log gets N×20 lines a second, in bursts every 100 ms.
write() {
	local name=$1 per=$2 n=0
	while :; do
		for ((i = 0; i < per; i++)); do
			n=$((n + 1))
			printf '%s line %d %s\n' "$name" "$n" "$(date +%T.%N)"
		done >>"$work/src/$name"
		sleep 0.1
	done
}
for i in 1 2 3 4; do
	write "app$i.log" $((i * 2)) &
	pids+=($!)
done
sleep 1

worker() {
	"$work/spate" backfill --follow --src "$work/src" --dst "$work/dst" --job logs \
		--embed-addr "$etcd" --data-dir "$work/etcd-$1" --metrics-addr "$2" \
		--lease 3s --rate 80 --quiet >"$work/$1.log" 2>&1 &
	pids+=($!)
}
worker w1 "$m1"
sleep 3
worker w2 "$m2"

sleep $((run / 2))
# A create rotation of app2.log: its writer goes on in the new file.
mv "$work/src/app2.log" "$work/src/app2.log.1"
sleep $((run - run / 2))

# The page streams updates and never finishes loading: --timeout takes
# the shot 5 s after the navigation (the charts are drawn by the server).
timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --hide-scrollbars \
	--window-size=1700,1250 --timeout=5000 \
	--screenshot="$work/page.png" "http://$m1/ui/jobs/logs" >/dev/null 2>&1
cp "$work/page.png" "$out"
echo "wrote $out"
