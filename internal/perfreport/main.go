// Command perfreport runs spate's benchmarks and writes docs/performance.md:
// every figure beside the command that produced it, its spread, and every
// ratio the project has a goal for beside that goal.
//
//	go run ./internal/perfreport                  # the full report, about 20 minutes on 2 cores
//	go run ./internal/perfreport -rounds 1 -quick -out /tmp/perf.md   # a few minutes
//
// Each package's test binary is built once (go test -c), then the
// benchmarks run in interleaved rounds: a round runs every benchmark of a
// section once, each in its own process, and the next round runs them in
// the reverse order (A B, B A, A B, ...), so drift on a shared machine
// falls on both sides of a pair. A ratio is taken per round, from the two
// figures of that round, and reported as the median and range of those
// per-round ratios.
//
// Store benchmarks run against real servers: embedded etcd, embedded
// nats-server, and a spawned redis-server (Debian's package).
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// bench is one benchmark run: a -test.bench pattern and its -test.benchtime.
type bench struct {
	pattern string
	time    string
	quick   string // -quick's benchtime; "" skips the run under -quick
}

// pair is a ratio with a goal: per round, the figure of num's metric over
// den's.
type pair struct {
	label    string
	num, den string // benchmark names, without the -GOMAXPROCS suffix
	metric   string // default ns/op
	goal     string // "" when there is none
	ok       func(float64) bool
}

// limit is a goal on one benchmark's own metric, per round.
type limit struct {
	label  string
	name   string
	metric string
	goal   string
	ok     func(float64) bool
}

type section struct {
	title   string
	pkg     string // ./stores/etcd
	benches []bench
	pairs   []pair
	limits  []limit
	note    string
}

// samples are one benchmark's figures, per metric, per round (NaN-free:
// a round whose run failed has no entry).
type samples map[string]map[int]float64 // metric → round → value

func le(x float64) func(float64) bool { return func(v float64) bool { return v <= x } }
func ge(x float64) func(float64) bool { return func(v float64) bool { return v >= x } }
func lt(x float64) func(float64) bool { return func(v float64) bool { return v < x } }

// exact anchors every element of a benchmark name, so that the pattern
// runs that benchmark and no other.
func exact(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

func b(name, time, quick string) bench { return bench{exact(name), time, quick} }

// storeSection is the coordination section of one store driver; raw is
// the driver's raw-client CAS benchmark, "" for none (then there are no
// goals: the goals are relative to a real backend's round trip).
func storeSection(title, pkg, raw string, commitGoal float64) section {
	const conf = "BenchmarkConformance/"
	ct := conf + "CommitThroughput/"
	s := section{
		title: title, pkg: pkg,
		benches: []bench{
			b(conf+"StoreUpdate", "500x", "200x"),
			b(conf+"FencedCommit", "500x", "200x"),
			b(conf+"ReleaseReclaim", "100x", "20x"),
			b(ct+"coordinator/N=1", "1000x", "300x"),
			b(ct+"raw/N=1", "1000x", "300x"),
			b(ct+"coordinator/N=16", "10000x", "2000x"),
			b(ct+"raw/N=16", "10000x", "2000x"),
			b(conf+"Takeover", "2x", ""),
		},
	}
	if raw != "" {
		s.benches = slices.Insert(s.benches, 2, b(raw, "500x", "200x"))
		s.pairs = append(s.pairs,
			pair{label: "fenced commit ÷ the backend's raw CAS", num: conf + "FencedCommit", den: raw,
				goal: fmt.Sprintf("≤ %.1f×", commitGoal), ok: le(commitGoal)},
			pair{label: "the driver's CAS ÷ the backend's raw CAS", num: conf + "StoreUpdate", den: raw})
	}
	n16 := pair{label: "commit throughput, coordinator ÷ raw, N=16", num: ct + "raw/N=16", den: ct + "coordinator/N=16"}
	if raw != "" {
		n16.goal, n16.ok = "≥ 0.7×", ge(0.7)
	}
	s.pairs = append(s.pairs,
		pair{label: "fenced commit ÷ a CAS through the Store interface", num: conf + "FencedCommit", den: conf + "StoreUpdate"},
		pair{label: "commit throughput, coordinator ÷ raw, N=1", num: ct + "raw/N=1", den: ct + "coordinator/N=1"},
		n16,
	)
	return s
}

// natsSection is storeSection for NATS with two more rows, which split the
// fenced commit's cost: a commit's write comes back to the committer's own
// watch, and JetStream charges for that delivery even to nats.go's own
// watcher.
func natsSection() section {
	s := storeSection("Coordination over stores/nats (embedded nats-server)", "./stores/nats", "BenchmarkRawKVUpdate", 1.2)
	s.benches = append(s.benches, b("BenchmarkRawKVUpdateWatched", "500x", "200x"), b("BenchmarkStoreUpdateWatched", "500x", "200x"))
	s.pairs = append(s.pairs,
		pair{label: "the raw CAS with nats.go's own KV watcher open ÷ the raw CAS", num: "BenchmarkRawKVUpdateWatched", den: "BenchmarkRawKVUpdate"},
		pair{label: "the driver's CAS with the driver's watch open ÷ the raw CAS", num: "BenchmarkStoreUpdateWatched", den: "BenchmarkRawKVUpdate"})
	return s
}

func sections() []section {
	tp := "BenchmarkThroughput/"
	return []section{
		{
			title: "Pipeline throughput", pkg: "./pipeline",
			benches: []bench{
				b(tp+"fair/sink=nop", "20x", "5x"),
				b(tp+"runtime/sink=nop", "20x", "5x"),
				b(tp+"fair/sink=file", "20x", "3x"),
				b(tp+"runtime/sink=file", "20x", "3x"),
				b(tp+"fairtuned/sink=nop", "20x", "5x"),
				b(tp+"bare", "20x", "5x"),
			},
			pairs: []pair{
				{label: "runtime ÷ fair loop, records/s, no-op sink", num: tp + "fair/sink=nop", den: tp + "runtime/sink=nop", goal: "≥ 0.8×", ok: ge(0.8)},
				{label: "runtime ÷ fair loop, records/s, FileSink", num: tp + "fair/sink=file", den: tp + "runtime/sink=file", goal: "≥ 0.6×", ok: ge(0.6)},
				{label: "runtime ÷ the tuned fair loop, records/s, no-op sink", num: tp + "fairtuned/sink=nop", den: tp + "runtime/sink=nop"},
			},
			limits: []limit{
				{"runtime, no-op sink: bytes allocated per record", tp + "runtime/sink=nop", "B/record", "< 8", lt(8)},
				{"runtime, FileSink: bytes allocated per record", tp + "runtime/sink=file", "B/record", "< 8", lt(8)},
			},
			note: "Every op moves the same 1M records (4 lanes × 250k), so ns/op compares directly. " +
				"fair is the hand-off loop of issue 17 (512-record polls, 64 KiB chunks, a queue of 64 chunks to a sink goroutine); " +
				"fairtuned is the same loop with the runtime's own copy loop; bare polls and releases without copying (a reference line, not a baseline). " +
				"B/record is the steady state: one untimed op fills the pools first and its allocation is warmup-B/record.",
		},
		storeSection("Coordination over stores/etcd (embedded etcd, one member)", "./stores/etcd", "BenchmarkRawTxnCAS", 1.2),
		natsSection(),
		storeSection("Coordination over stores/redis (spawned redis-server)", "./stores/redis", "BenchmarkRawScriptCAS", 1.5),
		storeSection("Coordination over stores/mem", "./stores/mem", "", 0),
		{
			title: "Desired assignment and the improve pass", pkg: ".",
			benches: []bench{
				{"^BenchmarkAssign$", "3x", ""},
				b("BenchmarkImprove/splits=1200/members=7/impl=fast", "50x", "10x"),
				b("BenchmarkImprove/splits=1200/members=7/impl=original", "50x", "10x"),
				b("BenchmarkImprove/splits=10000/members=50/impl=fast", "20x", ""),
				b("BenchmarkImprove/splits=10000/members=50/impl=original", "20x", ""),
				b("BenchmarkMemoryPerSplit", "1x", ""),
			},
			pairs: []pair{
				{label: "improve pass, original ÷ ours, 1200 splits × 7", num: "BenchmarkImprove/splits=1200/members=7/impl=original", den: "BenchmarkImprove/splits=1200/members=7/impl=fast"},
				{label: "improve pass, original ÷ ours, 10000 splits × 50", num: "BenchmarkImprove/splits=10000/members=50/impl=original", den: "BenchmarkImprove/splits=10000/members=50/impl=fast"},
			},
		},
	}
}

var line = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)

// parse reads go test -bench output: benchmark name → metric → value.
// A name seen twice keeps its last line.
func parse(raw []byte) map[string]map[string]float64 {
	res := map[string]map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		f := strings.Fields(m[2])
		vals := map[string]float64{}
		for i := 0; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				vals[f[i+1]] = v
			}
		}
		if len(vals) > 0 {
			res[m[1]] = vals
		}
	}
	return res
}

// add files one run's figures under its round.
func (s samples) add(round int, vals map[string]float64) {
	for unit, v := range vals {
		if s[unit] == nil {
			s[unit] = map[int]float64{}
		}
		s[unit][round] = v
	}
}

func (s samples) values(metric string) []float64 {
	var xs []float64
	for _, v := range s[metric] {
		xs = append(xs, v)
	}
	slices.Sort(xs)
	return xs
}

// median of xs (of an even count, the mean of the middle two).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[n/2]
}

// ratios is num's metric over den's, per round where both have one, in
// round order.
func ratios(num, den samples, metric string) []float64 {
	var rounds []int
	for r := range num[metric] {
		if _, ok := den[metric][r]; ok {
			rounds = append(rounds, r)
		}
	}
	slices.Sort(rounds)
	var out []float64
	for _, r := range rounds {
		if d := den[metric][r]; d != 0 {
			out = append(out, num[metric][r]/d)
		}
	}
	return out
}

// human formats a metric's value.
func human(unit string, v float64) string {
	if unit == "ns/op" {
		d := time.Duration(v)
		switch {
		case d >= time.Second:
			return fmt.Sprintf("%.2f s", d.Seconds())
		case d >= time.Millisecond:
			return fmt.Sprintf("%.2f ms", float64(d)/1e6)
		case d >= time.Microsecond:
			return fmt.Sprintf("%.1f µs", float64(d)/1e3)
		}
		return fmt.Sprintf("%.0f ns", v)
	}
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.3g M", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.3g k", v/1e3)
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

func fmtRatios(rs []float64) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%.2f", r)
	}
	return strings.Join(parts, ", ")
}

// verdict says whether the median meets the goal.
func verdict(ok func(float64) bool, med float64, n int) string {
	switch {
	case ok == nil:
		return "—"
	case n == 0:
		return "no data"
	case ok(med):
		return "met"
	}
	return "**not met**"
}

// goalRow is one line of the goals table: what, the per-round figures, the
// median, the range, the goal and the verdict.
type goalRow struct {
	section, label, figures, median, spread, goal, verdict string
}

func ratioRow(title string, p pair, res map[string]samples) goalRow {
	metric := p.metric
	if metric == "" {
		metric = "ns/op"
	}
	rs := ratios(res[p.num], res[p.den], metric)
	row := goalRow{section: title, label: p.label, figures: fmtRatios(rs), goal: p.goal, verdict: verdict(p.ok, median(rs), len(rs))}
	if p.goal == "" {
		row.goal = "—"
	}
	if len(rs) > 0 {
		row.median = fmt.Sprintf("**%.2f×**", median(rs))
		row.spread = fmt.Sprintf("%.2f – %.2f", slices.Min(rs), slices.Max(rs))
	}
	return row
}

func limitRow(title string, l limit, res map[string]samples) goalRow {
	var rounds []int
	for r := range res[l.name][l.metric] {
		rounds = append(rounds, r)
	}
	slices.Sort(rounds)
	var xs []float64
	for _, r := range rounds {
		xs = append(xs, res[l.name][l.metric][r])
	}
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = human(l.metric, x)
	}
	row := goalRow{section: title, label: l.label, figures: strings.Join(parts, ", "), goal: "—", verdict: verdict(l.ok, median(xs), len(xs))}
	if l.ok != nil {
		row.goal = l.goal + " " + l.metric
	}
	if len(xs) > 0 {
		row.median = "**" + human(l.metric, median(xs)) + "**"
		row.spread = human(l.metric, slices.Min(xs)) + " – " + human(l.metric, slices.Max(xs))
	}
	return row
}

// lifecycleGoals are the store calls per split lifecycle the issue asks for.
var lifecycleGoals = map[string]int{"claim": 2, "takeover": 2, "commit": 1, "release": 1}

var costLine = regexp.MustCompile(`lifecycle (\S+) ([a-z ]+)=(\d+)`)

// lifecycleCounts reads the store calls per lifecycle step that
// TestStoreCallsPerLifecycle logs (-test.v), per mode: "plain" (a store
// without the Releaser capability) and "releaser".
func lifecycleCounts(out []byte) map[string]map[string]int {
	counts := map[string]map[string]int{}
	for _, m := range costLine.FindAllSubmatch(out, -1) {
		n, _ := strconv.Atoi(string(m[3]))
		mode := string(m[1])
		if counts[mode] == nil {
			counts[mode] = map[string]int{}
		}
		counts[mode][string(m[2])] = n
	}
	return counts
}

func loadavg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func shq(s string) string {
	if strings.ContainsAny(s, "^$|()*? ") {
		return "'" + s + "'"
	}
	return s
}

func main() {
	rounds := flag.Int("rounds", 5, "interleaved rounds (every benchmark runs once per round)")
	quick := flag.Bool("quick", false, "shorter benchtimes, and skip the slow benchmarks (takeover, large assignment, memory)")
	only := flag.String("only", "", "run only the sections whose title contains this")
	out := flag.String("out", "docs/performance.md", "where to write the report")
	flag.Parse()
	if _, err := os.Stat("go.mod"); err != nil {
		fatalf("run from the module root: %v", err)
	}
	bin, err := os.MkdirTemp("", "perfreport-")
	if err != nil {
		fatalf("%v", err)
	}
	defer os.RemoveAll(bin)
	root, _ := os.Getwd()

	loadStart := loadavg()
	started := time.Now()
	var goals []goalRow
	var body bytes.Buffer
	for _, sec := range sections() {
		if *only != "" && !strings.Contains(sec.title, *only) {
			continue
		}
		goals = append(goals, runSection(&body, sec, root, bin, *rounds, *quick)...)
	}
	goals = append(goals, lifecycle(&body, root, bin))
	goals = append(goals, backendLifecycle(&body, root, bin))
	if *only == "" || strings.Contains("Backfill", *only) {
		goals = append(goals, backfill(&body, root, *rounds)...)
	}

	var doc bytes.Buffer
	cmdline := "go run ./internal/perfreport"
	if len(os.Args) > 1 {
		cmdline += " " + strings.Join(os.Args[1:], " ")
	}
	fmt.Fprintf(&doc, "# Performance\n\nProduced by `%s` on %s, %d CPUs, %s, %s; it took %s. "+
		"Load average (1, 5, 15 min) at the start %s, at the end %s: the machine is shared, read the spreads.\n\n",
		cmdline, runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU(), runtime.Version(),
		started.UTC().Format("2006-01-02 15:04 MST"), time.Since(started).Round(time.Second), loadStart, loadavg())
	fmt.Fprintf(&doc, "How: each package's test binary is built once (`go test -c`); then, per section, %d interleaved rounds: "+
		"a round runs every benchmark of the section once, each in its own process started in the package's directory, "+
		"and every other round runs them in the reverse order (A B, B A, …). "+
		"A figure is the median of its rounds with the range (min – max) beside it; a ratio is computed within each round, "+
		"from the two figures of that round, and shown per round, as their median and as their range. "+
		"Each row names its command: the binary is `go test -c -o <pkg>.test <pkg>`.\n\n", *rounds)
	doc.WriteString("## Goals\n\n| section | what | per round | median | range | goal | |\n|---|---|---|---|---|---|---|\n")
	for _, g := range goals {
		fmt.Fprintf(&doc, "| %s | %s | %s | %s | %s | %s | %s |\n", g.section, g.label, g.figures, g.median, g.spread, g.goal, g.verdict)
	}
	doc.WriteString("\n")
	doc.Write(body.Bytes())
	if err := os.WriteFile(*out, doc.Bytes(), 0o644); err != nil {
		fatalf("%v", err)
	}
	fmt.Fprintf(os.Stderr, "wrote %s in %s\n", *out, time.Since(started).Round(time.Second))
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "perfreport: "+format+"\n", args...)
	os.Exit(1)
}

// build compiles pkg's test binary into bin and returns its path.
func build(root, bin, pkg string) (string, error) {
	name := strings.Trim(strings.ReplaceAll(strings.TrimPrefix(pkg, "./"), "/", "-"), ".")
	if name == "" {
		name = "spate"
	}
	path := filepath.Join(bin, name+".test")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	cmd := exec.Command("go", "test", "-c", "-o", path, pkg)
	cmd.Dir, cmd.Stdout, cmd.Stderr = root, os.Stderr, os.Stderr
	fmt.Fprintf(os.Stderr, "building: go test -c -o %s %s\n", path, pkg)
	return path, cmd.Run()
}

// runSection builds a section's test binary, runs its benchmarks for the
// rounds, and writes the section: the runs that failed, the table of
// results, and the goals (ratios and limits), which it returns.
func runSection(doc *bytes.Buffer, sec section, root, bin string, rounds int, quick bool) []goalRow {
	fmt.Fprintf(doc, "## %s\n\n", sec.title)
	exe, err := build(root, bin, sec.pkg)
	if err != nil {
		fmt.Fprintf(doc, "**The build failed** (`go test -c %s`: %v).\n\n", sec.pkg, err)
		return nil
	}
	r := runRounds(exe, root, sec, rounds, quick)
	fmt.Fprintf(doc, "Built with `go test -c -o %s %s`; run in `%s`.\n\n", filepath.Base(exe), sec.pkg, sec.pkg)
	for _, f := range r.failures {
		fmt.Fprintf(doc, "- **A run failed**: %s\n", f)
	}
	if len(r.failures) > 0 {
		doc.WriteString("\n")
	}
	writeResults(doc, r)
	goals := writeGoals(doc, sec, r.res, quick)
	if sec.note != "" {
		fmt.Fprintf(doc, "%s\n\n", sec.note)
	}
	return goals
}

// roundsRun is what a section's rounds produced.
type roundsRun struct {
	res      map[string]samples
	cmdOf    map[string]string // benchmark name → the command that produced it
	failures []string
}

// runRounds runs the section's benchmarks (under -quick, only those with
// a quick time) for the rounds, every other round in reverse order so that
// no benchmark always runs on a warm or a cold machine.
func runRounds(exe, root string, sec section, rounds int, quick bool) roundsRun {
	var benches []bench
	for _, bn := range sec.benches {
		if quick {
			if bn.quick == "" {
				continue
			}
			bn.time = bn.quick
		}
		benches = append(benches, bn)
	}
	out := roundsRun{res: map[string]samples{}, cmdOf: map[string]string{}}
	for r := range rounds {
		order := slices.Clone(benches)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, bn := range order {
			args := []string{"-test.run", "^$", "-test.bench", bn.pattern, "-test.benchtime", bn.time, "-test.benchmem"}
			shown := filepath.Base(exe)
			for _, a := range args {
				shown += " " + shq(a)
			}
			fmt.Fprintf(os.Stderr, "round %d/%d: (cd %s && %s)\n", r+1, rounds, sec.pkg, shown)
			cmd := exec.Command(exe, args...)
			cmd.Dir = filepath.Join(root, sec.pkg)
			cmd.Stderr = os.Stderr
			raw, err := cmd.Output()
			got := parse(raw)
			if err != nil || len(got) == 0 {
				out.failures = append(out.failures, fmt.Sprintf("round %d, `%s`: %v, %d results%s", r+1, shown, err, len(got), failureDetail(raw)))
			}
			for name, vals := range got {
				if out.res[name] == nil {
					out.res[name] = samples{}
				}
				out.res[name].add(r, vals)
				out.cmdOf[name] = shown
			}
		}
	}
	return out
}

// writeResults writes the table of every benchmark's figures.
func writeResults(doc *bytes.Buffer, r roundsRun) {
	names := make([]string, 0, len(r.res))
	for n := range r.res {
		names = append(names, n)
	}
	slices.Sort(names)
	doc.WriteString("| benchmark | ns/op, median | ns/op, min – max | other figures (medians) | command |\n|---|---|---|---|---|\n")
	for _, n := range names {
		ns := r.res[n].values("ns/op")
		med, spread := "", ""
		if len(ns) > 0 {
			med = human("ns/op", median(ns))
			spread = human("ns/op", ns[0]) + " – " + human("ns/op", ns[len(ns)-1])
		}
		var units []string
		for u := range r.res[n] {
			if u != "ns/op" {
				units = append(units, u)
			}
		}
		slices.Sort(units)
		var other []string
		for _, u := range units {
			other = append(other, human(u, median(r.res[n].values(u)))+" "+u)
		}
		fmt.Fprintf(doc, "| %s | %s | %s | %s | `%s` |\n", strings.TrimPrefix(n, "Benchmark"), med, spread, strings.Join(other, ", "), r.cmdOf[n])
	}
	doc.WriteString("\n")
}

// writeGoals judges and writes the section's ratios and limits.
func writeGoals(doc *bytes.Buffer, sec section, res map[string]samples, quick bool) []goalRow {
	var goals []goalRow
	short := strings.SplitN(sec.title, " (", 2)[0]
	for _, p := range sec.pairs {
		if quick && (res[p.num] == nil || res[p.den] == nil) {
			continue // skipped under -quick
		}
		g := ratioRow(short, p, res)
		goals = append(goals, g)
		fmt.Fprintf(doc, "- %s (%s over %s, per round): %s; median %s, range %s; goal %s: %s\n", p.label,
			strings.TrimPrefix(p.num, "Benchmark"), strings.TrimPrefix(p.den, "Benchmark"), g.figures, g.median, g.spread, g.goal, g.verdict)
	}
	for _, l := range sec.limits {
		if quick && res[l.name] == nil {
			continue
		}
		g := limitRow(short, l, res)
		goals = append(goals, g)
		fmt.Fprintf(doc, "- %s, per round: %s; median %s; goal %s: %s\n", l.label, g.figures, g.median, g.goal, g.verdict)
	}
	if len(sec.pairs)+len(sec.limits) > 0 {
		doc.WriteString("\n")
	}
	return goals
}

// lifecycle runs TestStoreCallsPerLifecycle and reports the counts it
// asserts against the goals.
func lifecycle(doc *bytes.Buffer, root, bin string) goalRow {
	const test = "TestStoreCallsPerLifecycle"
	doc.WriteString("## Store calls per split lifecycle\n\n")
	row := goalRow{section: "Lifecycle", label: "store calls per claim / takeover / commit / release", goal: "2 / 2 / 1 / 1", median: "—", spread: "—"}
	exe, err := build(root, bin, ".")
	if err != nil {
		row.verdict = "build failed"
		return row
	}
	cmd := exec.Command(exe, "-test.run", "^"+test+"$", "-test.count", "1", "-test.v")
	cmd.Dir = root
	outp, err := cmd.CombinedOutput()
	all := lifecycleCounts(outp)
	counts := all["releaser"]
	fmt.Fprintf(doc, "`%s -test.run '^%s$' -test.v` (the fake store counts every call, and the test asserts each count and logs it; "+
		"the goal row is a store with the Releaser capability — mem, etcd, Redis — and the last column a store without it — NATS): ",
		filepath.Base(exe), test)
	switch {
	case err != nil:
		fmt.Fprintf(doc, "**the test failed** (%v):\n\n```\n%s\n```\n\n", err, bytes.TrimSpace(outp))
		row.verdict = "test failed"
		return row
	case len(counts) == 0:
		doc.WriteString("passed, but it logged no counts.\n\n")
		row.verdict = "unknown"
		return row
	}
	doc.WriteString("passed.\n\n| step | store calls | goal | without the Releaser capability |\n|---|---|---|---|\n")
	var figs []string
	met := true
	for _, step := range []string{"claim", "takeover", "commit", "release"} {
		n, ok := counts[step]
		fig := "?"
		if ok {
			fig = strconv.Itoa(n)
		}
		figs = append(figs, fig)
		met = met && ok && n <= lifecycleGoals[step]
		plain := "?"
		if n, ok := all["plain"][step]; ok {
			plain = strconv.Itoa(n)
		}
		fmt.Fprintf(doc, "| %s | %s | %d | %s |\n", step, fig, lifecycleGoals[step], plain)
	}
	doc.WriteString("\n")
	row.figures = strings.Join(figs, " / ")
	row.verdict = "met"
	if !met {
		row.verdict = "**not met**"
	}
	return row
}

// lifecycleBackends are the drivers whose TestStoreCallsPerLifecycle
// (scale.MeasureLifecycle) counts the calls against a real server.
var lifecycleBackends = []string{"./stores/mem", "./stores/etcd", "./stores/nats", "./stores/redis"}

// plainGoals are lifecycleGoals on a store without the Releaser
// capability: the release is the owner-clear and the lease delete.
var plainGoals = map[string]int{"claim": 2, "takeover": 2, "commit": 1, "release": 2}

// lifecycleFigures is one backend's counts as "claim/takeover/commit/
// release" per mode it ran ("releaser", then "plain"), and whether each
// mode that ran has every step and meets its goals.
func lifecycleFigures(counts map[string]map[string]int) (figs []string, met bool) {
	met = len(counts) > 0
	for _, mode := range []string{"releaser", "plain"} {
		c, ok := counts[mode]
		if !ok {
			continue
		}
		goals := map[string]map[string]int{"releaser": lifecycleGoals, "plain": plainGoals}[mode]
		var parts []string
		for _, step := range []string{"claim", "takeover", "commit", "release"} {
			n, ok := c[step]
			if !ok {
				parts = append(parts, "?")
				met = false
				continue
			}
			parts = append(parts, strconv.Itoa(n))
			met = met && n <= goals[step]
		}
		figs = append(figs, mode+" "+strings.Join(parts, "/"))
	}
	return figs, met
}

// backendLifecycle runs every driver's TestStoreCallsPerLifecycle and
// reports its counts, per backend and mode.
func backendLifecycle(doc *bytes.Buffer, root, bin string) goalRow {
	const test = "TestStoreCallsPerLifecycle"
	row := goalRow{section: "Lifecycle", label: "store calls per claim / takeover / commit / release on real servers",
		goal: "2 / 2 / 1 / 1 (release 2 without the Releaser capability)", median: "—", spread: "—", verdict: "met"}
	fmt.Fprintf(doc, "Per backend, `<pkg>.test -test.run '^%s$' -test.v` in the package's directory "+
		"(scale.MeasureLifecycle: two coordinators over the real server, a counting wrapper on each store; "+
		"\"releaser\" is the store as it is, \"plain\" with the Releaser capability hidden, or a store without it):\n\n"+
		"| backend | claim / takeover / commit / release | |\n|---|---|---|\n", test)
	var all []string
	for _, pkg := range lifecycleBackends {
		name := strings.TrimPrefix(pkg, "./stores/")
		exe, err := build(root, bin, pkg)
		if err != nil {
			fmt.Fprintf(doc, "| %s | build failed | |\n", name)
			row.verdict = "build failed"
			continue
		}
		cmd := exec.Command(exe, "-test.run", "^"+test+"$", "-test.count", "1", "-test.v")
		cmd.Dir = filepath.Join(root, pkg)
		outp, err := cmd.CombinedOutput()
		figs, met := lifecycleFigures(lifecycleCounts(outp))
		verdict := "met"
		switch {
		case err != nil:
			verdict = "**the test failed**"
			row.verdict = "test failed"
		case !met:
			verdict = "**not met**"
			if row.verdict == "met" {
				row.verdict = "**not met**"
			}
		}
		fmt.Fprintf(doc, "| %s | %s | %s |\n", name, strings.Join(figs, ", "), verdict)
		all = append(all, name+" "+strings.Join(figs, ", "))
	}
	doc.WriteString("\n")
	row.figures = strings.Join(all, "; ")
	return row
}

// backfillRound is one round line of scripts/backfill-bench.sh: seconds
// for awk and, for one and three workers, wall, first split and copy.
type backfillRound struct {
	awk, wall1, first1, copy1, wall3, first3, copy3 float64
}

// parseBackfill reads the round lines of scripts/backfill-bench.sh
// ("1  spate  0.129 | 0.9 0.4 0.14 | ..."), in order.
func parseBackfill(raw []byte) []backfillRound {
	var out []backfillRound
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		f := strings.Fields(strings.ReplaceAll(sc.Text(), "|", " "))
		if len(f) != 9 || f[1] != "spate" {
			continue
		}
		if _, err := strconv.Atoi(f[0]); err != nil {
			continue
		}
		var v [7]float64
		ok := true
		for i := range v {
			x, err := strconv.ParseFloat(f[i+2], 64)
			ok = ok && err == nil
			v[i] = x
		}
		if ok {
			out = append(out, backfillRound{v[0], v[1], v[2], v[3], v[4], v[5], v[6]})
		}
	}
	return out
}

// backfill runs scripts/backfill-bench.sh (awk and spate interleaved in
// every round) and reports the copy phase against awk, per round.
func backfill(doc *bytes.Buffer, root string, rounds int) []goalRow {
	const script = "scripts/backfill-bench.sh"
	doc.WriteString("## The main job: spate backfill beside awk\n\n")
	if _, err := os.Stat(filepath.Join(root, script)); err != nil {
		fmt.Fprintf(doc, "%s is missing.\n\n", script)
		return nil
	}
	shown := fmt.Sprintf("RUNS=%d %s", rounds, script)
	fmt.Fprintf(os.Stderr, "running: %s\n", shown)
	cmd := exec.Command("bash", script)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "RUNS="+strconv.Itoa(rounds))
	cmd.Stderr = os.Stderr
	outp, err := cmd.Output()
	rs := parseBackfill(outp)
	fmt.Fprintf(doc, "`%s` (the corpus of issue 17; awk and spate alternate within each round):\n\n", shown)
	if err != nil {
		fmt.Fprintf(doc, "**The script failed** (%v).\n\n", err)
	}
	fmt.Fprintf(doc, "```\n%s\n```\n\n", bytes.TrimSpace(outp))
	res := map[string]samples{"awk": {}, "copy1": {}, "copy3": {}, "first1": {}, "first3": {}}
	for i, r := range rs {
		res["awk"].add(i, map[string]float64{"s": r.awk})
		res["copy1"].add(i, map[string]float64{"s": r.copy1})
		res["copy3"].add(i, map[string]float64{"s": r.copy3})
		res["first1"].add(i, map[string]float64{"s": r.first1})
		res["first3"].add(i, map[string]float64{"s": r.first3})
	}
	const title = "Backfill"
	goals := []goalRow{
		ratioRow(title, pair{label: "copy phase ÷ awk + fsync, 1 worker", num: "copy1", den: "awk", metric: "s", goal: "≤ 3×", ok: le(3)}, res),
		ratioRow(title, pair{label: "copy phase ÷ awk + fsync, 3 workers", num: "copy3", den: "awk", metric: "s", goal: "≤ 3×", ok: le(3)}, res),
		limitRow(title, limit{"time to the first split (s), 1 worker", "first1", "s", "", nil}, res),
		limitRow(title, limit{"time to the first split (s), 3 workers", "first3", "s", "", nil}, res),
	}
	for _, g := range goals {
		fmt.Fprintf(doc, "- %s, per round: %s; median %s, range %s; goal %s: %s\n", g.label, g.figures, g.median, g.spread, g.goal, g.verdict)
	}
	doc.WriteString("\n")
	return goals
}

// failureDetail is what a failed benchmark printed from its first
// "--- FAIL" line on (at most six lines), for the report: "" if nothing.
func failureDetail(raw []byte) string {
	var lines []string
	in := false
	for l := range strings.SplitSeq(string(raw), "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "--- FAIL") {
			in = true
		}
		if in && l != "" && l != "FAIL" && len(lines) < 6 {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return ""
	}
	return ": `" + strings.ReplaceAll(strings.Join(lines, " / "), "`", "'") + "`"
}
