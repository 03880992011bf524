package main

import (
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const benchOutput = `goos: linux
goarch: amd64
pkg: github.com/spate-go/spate/pipeline
cpu: AMD EPYC
BenchmarkThroughput/fair/sink=nop-2         	      10	  26616356 ns/op	         1.109 B/record	  37570883 records/s	 1109272 B/op	    7754 allocs/op
BenchmarkConformance/CommitThroughput/raw/N=16
    bench.go:12: some log line
BenchmarkConformance/CommitThroughput/raw/N=16-2 	   10000	     61234 ns/op	     16330 commits/s
BenchmarkNoProcs 	       3	 100 ns/op
--- FAIL: BenchmarkBroken
PASS
`

func TestParse(t *testing.T) {
	got := parse([]byte(benchOutput))
	require.Len(t, got, 3)
	fair := got["BenchmarkThroughput/fair/sink=nop"]
	require.NotNil(t, fair, "the -GOMAXPROCS suffix is cut from the name")
	assert.InDelta(t, 26616356, fair["ns/op"], 0)
	assert.InDelta(t, 1.109, fair["B/record"], 1e-9)
	assert.InDelta(t, 7754, fair["allocs/op"], 0)
	assert.InDelta(t, 16330, got["BenchmarkConformance/CommitThroughput/raw/N=16"]["commits/s"], 0,
		"the name line a log interrupted is skipped, the result line kept")
	assert.InDelta(t, 100, got["BenchmarkNoProcs"]["ns/op"], 0)
}

func TestExactMatchesOnlyItsBenchmark(t *testing.T) {
	p := exact("BenchmarkThroughput/fair/sink=nop")
	assert.Equal(t, `^BenchmarkThroughput$/^fair$/^sink=nop$`, p)
	// go test splits -bench on slashes and matches each level on its own.
	levels := []string{"BenchmarkThroughput", "fairtuned", "sink=nop"}
	var matched []bool
	for i, part := range []string{`^BenchmarkThroughput$`, `^fair$`, `^sink=nop$`} {
		matched = append(matched, regexp.MustCompile(part).MatchString(levels[i]))
	}
	assert.Equal(t, []bool{true, false, true}, matched, "fair does not run fairtuned")
	assert.Equal(t, `^BenchmarkImprove$/^splits=1200$/^members=7$/^impl=fast$`, exact("BenchmarkImprove/splits=1200/members=7/impl=fast"))
	assert.Equal(t, `^a\.b$`, exact("a.b"), "metacharacters are quoted")
}

func roundsOf(metric string, byRound map[int]float64) samples {
	return samples{metric: byRound}
}

func TestRatiosArePerRound(t *testing.T) {
	// Drift: both sides slow down together in round 2; the per-round
	// ratio stays put where a ratio of medians would not.
	fenced := roundsOf("ns/op", map[int]float64{0: 110, 1: 220, 2: 120, 3: 115})
	raw := roundsOf("ns/op", map[int]float64{0: 100, 1: 200, 2: 100})
	rs := ratios(fenced, raw, "ns/op")
	require.Len(t, rs, 3, "round 3 has no raw figure and no ratio")
	assert.InDeltaSlice(t, []float64{1.1, 1.1, 1.2}, rs, 1e-9, "in round order")
	assert.InDelta(t, 1.1, median(rs), 1e-9)

	assert.Empty(t, ratios(fenced, raw, "B/op"), "no figures, no ratios")
	zero := roundsOf("ns/op", map[int]float64{0: 0})
	assert.Empty(t, ratios(fenced, zero, "ns/op"), "a zero denominator is skipped")
}

func TestMedian(t *testing.T) {
	assert.InDelta(t, 2, median([]float64{3, 1, 2}), 0)
	assert.InDelta(t, 2.5, median([]float64{4, 1, 2, 3}), 0, "the mean of the middle two of an even count")
	assert.InDelta(t, 0, median(nil), 0)
	xs := []float64{3, 1, 2}
	median(xs)
	assert.Equal(t, []float64{3, 1, 2}, xs, "the input is left unsorted")
}

func TestRatioRowAgainstItsGoal(t *testing.T) {
	res := map[string]samples{
		"fenced": roundsOf("ns/op", map[int]float64{0: 130, 1: 118, 2: 125}),
		"raw":    roundsOf("ns/op", map[int]float64{0: 100, 1: 100, 2: 100}),
	}
	g := ratioRow("etcd", pair{label: "fenced ÷ raw", num: "fenced", den: "raw", goal: "≤ 1.2×", ok: le(1.2)}, res)
	assert.Equal(t, "1.30, 1.18, 1.25", g.figures)
	assert.Equal(t, "**1.25×**", g.median)
	assert.Equal(t, "1.18 – 1.30", g.spread)
	assert.Equal(t, "**not met**", g.verdict)

	g = ratioRow("etcd", pair{label: "fenced ÷ raw", num: "fenced", den: "raw", goal: "≤ 1.3×", ok: le(1.3)}, res)
	assert.Equal(t, "met", g.verdict)

	g = ratioRow("etcd", pair{label: "no goal", num: "fenced", den: "raw"}, res)
	assert.Equal(t, "—", g.goal)
	assert.Equal(t, "—", g.verdict)

	g = ratioRow("etcd", pair{label: "missing", num: "fenced", den: "absent", goal: "≤ 1.2×", ok: le(1.2)}, res)
	assert.Equal(t, "no data", g.verdict)
	assert.Empty(t, g.median)
}

func TestLimitRow(t *testing.T) {
	res := map[string]samples{"rt": roundsOf("B/record", map[int]float64{0: 9.5, 1: 2.5, 2: 3})}
	g := limitRow("Pipeline", limit{"alloc", "rt", "B/record", "< 8", lt(8)}, res)
	assert.Equal(t, "9.5, 2.5, 3", g.figures)
	assert.Equal(t, "**3**", g.median)
	assert.Equal(t, "met", g.verdict)
	assert.Equal(t, "< 8 B/record", g.goal)
}

func TestLifecycleCounts(t *testing.T) {
	out := []byte(`=== RUN   TestStoreCallsPerLifecycle/plain
    claims_test.go:125: lifecycle plain claim=2
    claims_test.go:125: lifecycle plain release=2
=== RUN   TestStoreCallsPerLifecycle/releaser
    claims_test.go:125: lifecycle releaser claim=2
    claims_test.go:125: lifecycle releaser late release=4
    claims_test.go:125: lifecycle releaser release=1
`)
	assert.Equal(t, map[string]map[string]int{
		"plain":    {"claim": 2, "release": 2},
		"releaser": {"claim": 2, "late release": 4, "release": 1},
	}, lifecycleCounts(out))
}

func TestLifecycleFigures(t *testing.T) {
	figs, met := lifecycleFigures(map[string]map[string]int{
		"releaser": {"claim": 2, "takeover": 2, "commit": 1, "release": 1},
		"plain":    {"claim": 2, "takeover": 2, "commit": 1, "release": 2},
	})
	assert.Equal(t, []string{"releaser 2/2/1/1", "plain 2/2/1/2"}, figs)
	assert.True(t, met)

	figs, met = lifecycleFigures(map[string]map[string]int{"plain": {"claim": 2, "takeover": 2, "commit": 1, "release": 2}})
	assert.Equal(t, []string{"plain 2/2/1/2"}, figs, "a store without the Releaser capability runs plain only")
	assert.True(t, met)

	_, met = lifecycleFigures(map[string]map[string]int{"releaser": {"claim": 4, "takeover": 2, "commit": 1, "release": 1}})
	assert.False(t, met, "a claim of 4 calls misses the goal")
	figs, met = lifecycleFigures(map[string]map[string]int{"releaser": {"claim": 2, "commit": 1, "release": 1}})
	assert.Equal(t, []string{"releaser 2/?/1/1"}, figs)
	assert.False(t, met, "a missing step is not met")
	_, met = lifecycleFigures(nil)
	assert.False(t, met, "no counts is not met")
}

func TestHuman(t *testing.T) {
	assert.Equal(t, "1.50 s", human("ns/op", 1.5e9))
	assert.Equal(t, "2.50 ms", human("ns/op", 2.5e6))
	assert.Equal(t, "61.2 µs", human("ns/op", 61234))
	assert.Equal(t, "800 ns", human("ns/op", 800))
	assert.Equal(t, "37.6 M", human("records/s", 37570883))
	assert.Equal(t, "16.3 k", human("commits/s", 16330))
	assert.Equal(t, "1.11", human("B/record", 1.109))
	assert.Equal(t, "7754", human("allocs/op", 7754))
}

func TestParseBackfill(t *testing.T) {
	out := []byte(`corpus: 300 files
machine: 2 CPUs; load 0.50 0.60 0.70

round binary    awk | 1w-wall 1w-first 1w-copy | 3w-wall 3w-first 3w-copy
1     spate   0.129 |   0.912   0.400   0.140 |   1.500   0.500   0.141
2     spate   0.130 |   0.900   0.410   0.150 |   1.400   0.480   0.200

median spate  0.130 |   0.906   0.405   0.145 |   1.450   0.490   0.170
`)
	rs := parseBackfill(out)
	require.Len(t, rs, 2, "the median line is not a round")
	assert.Equal(t, backfillRound{0.129, 0.912, 0.4, 0.14, 1.5, 0.5, 0.141}, rs[0])

	res := map[string]samples{"awk": {}, "copy1": {}}
	for i, r := range rs {
		res["awk"].add(i, map[string]float64{"s": r.awk})
		res["copy1"].add(i, map[string]float64{"s": r.copy1})
	}
	g := ratioRow("Backfill", pair{label: "copy", num: "copy1", den: "awk", metric: "s", goal: "≤ 3×", ok: le(3)}, res)
	assert.Equal(t, "1.09, 1.15", g.figures)
	assert.Equal(t, "met", g.verdict)
}

func TestFailureDetail(t *testing.T) {
	out := []byte("goos: linux\n--- FAIL: BenchmarkMemoryPerSplit\n    memory_test.go:52: gained 4240 of 20000\nFAIL\n")
	assert.Equal(t, ": `--- FAIL: BenchmarkMemoryPerSplit / memory_test.go:52: gained 4240 of 20000`", failureDetail(out))
	assert.Empty(t, failureDetail([]byte("PASS\n")))
}
