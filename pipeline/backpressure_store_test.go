package pipeline_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/pipeline"
)

// A store that refuses commits stops the reading after a bounded amount:
// acknowledgments still advance the watermark (so the pending-batch
// ceiling never engages), but nothing read past the last commit that
// landed may exceed MaxUncommittedBytes. Once commits land again, reading
// resumes.
func TestUncommittedBytesCeilingStopsReadingWhileCommitsFail(t *testing.T) {
	testUncommittedCeiling(t, func(s *fakeSource, on bool) { s.failCommits.Store(on) })
}

// The same with a source that returns nil and defers the positions (a
// CoordinatedSource whose store refuses writes): deferred is not landed.
func TestUncommittedBytesCeilingHoldsWhileCommitsAreDeferred(t *testing.T) {
	testUncommittedCeiling(t, func(s *fakeSource, on bool) { s.deferCommits.Store(on) })
}

func testUncommittedCeiling(t *testing.T, refuse func(*fakeSource, bool)) {
	cfg := testConfig()
	cfg.MaxUncommittedBytes = 2000
	h := newHarness(t, cfg, modeOK, 0, assign(laneSpec{id: 0, part: 0, forever: true}))
	refuse(h.src, true)
	wait := h.run()
	// Every value is "v<offset>": at least 2 bytes, so 2000 bytes are at
	// most 1000 records, plus the batch (10 records) that crossed it.
	const most = 2000/2 + 10
	waitFor(t, "reading to start", func() bool { return h.consumed.Load() > 0 })
	var plateau int64
	for range 3 {
		time.Sleep(150 * time.Millisecond) // many commit ticks, all failing
		n := h.consumed.Load()
		require.LessOrEqual(t, n, int64(most), "records read while no commit landed; the ceiling allows at most %d", most)
		plateau = n
	}
	if h.src.pauseCount() != 0 {
		require.FailNow(t, "the ceiling paused the source")
	}
	refuse(h.src, false)
	waitFor(t, "reading to resume once commits land", func() bool { return h.consumed.Load() > plateau+3*most })
	h.rt.Stop()
	if r := wait(); r.State != pipeline.Stopped {
		require.FailNowf(t, "the run did not stop", "state %v: %v", r.State, r.Failure)
	}
}

// logRecords keeps every log record's level, message and attributes.
type logRecords struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.recs = append(l.recs, r.Clone())
	l.mu.Unlock()
	return nil
}
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecords) WithGroup(string) slog.Handler      { return l }

// matching returns the records at level whose message contains msg.
func (l *logRecords) matching(level slog.Level, msg string) []slog.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []slog.Record
	for _, r := range l.recs {
		if r.Level == level && strings.Contains(r.Message, msg) {
			out = append(out, r)
		}
	}
	return out
}

func attrInt(r slog.Record, key string) (int64, bool) {
	var v int64
	found := false
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v, found = a.Value.Int64(), true
			return false
		}
		return true
	})
	return v, found
}

// A store refusing commits for many ticks warns once, not once a tick;
// when commits land again one line says how many failed.
func TestFailingCommitsWarnRateLimited(t *testing.T) {
	logs := &logRecords{}
	cfg := testConfig() // a 20ms commit tick
	h := newHarnessWith(t, cfg, []pipeline.Option{pipeline.WithLogger(slog.New(logs))}, modeOK, 0,
		assign(laneSpec{id: 0, part: 0, forever: true}))
	h.src.failCommits.Store(true)
	wait := h.run()
	waitFor(t, "20 failed commits", func() bool {
		n := 0
		for _, e := range h.log.snapshot() {
			if e == "commit-failed" {
				n++
			}
		}
		return n >= 20
	})
	require.Len(t, logs.matching(slog.LevelWarn, "commit failed"), 1, "commit warnings for 20+ failed ticks within the %v limit", 30*time.Second)
	h.src.failCommits.Store(false)
	waitFor(t, "the recovery line", func() bool { return len(logs.matching(slog.LevelInfo, "commits landing again")) == 1 })
	n, ok := attrInt(logs.matching(slog.LevelInfo, "commits landing again")[0], "failed_commits")
	require.True(t, ok, "the recovery line counts the failed commits")
	require.GreaterOrEqual(t, n, int64(20), "the recovery line counts the failed commits")
	h.src.failCommits.Store(true)
	waitFor(t, "a new failure run to warn at once", func() bool { return len(logs.matching(slog.LevelWarn, "commit failed")) == 2 })
	h.src.failCommits.Store(false)
	h.rt.Stop()
	wait()
}

// At the default ceiling (64 MiB, far above what a small split holds),
// reading still stops once commits fail: what is read then cannot be
// committed, and all of it replays if the leases run out meanwhile (the
// operator re-run of issue 16 saw 31% of a Redis job's input duplicated
// while Redis refused writes). It resumes when a commit lands.
func TestReadingStopsWhileCommitsFailAtTheDefaultCeiling(t *testing.T) {
	for name, refuse := range map[string]func(*fakeSource, bool){
		"failing":  func(s *fakeSource, on bool) { s.failCommits.Store(on) },
		"deferred": func(s *fakeSource, on bool) { s.deferCommits.Store(on) },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig() // MaxUncommittedBytes at its default
			h := newHarness(t, cfg, modeOK, 0, assign(laneSpec{id: 0, part: 0, forever: true}))
			wait := h.run()
			waitFor(t, "reading to start", func() bool { return h.consumed.Load() > 100 })
			refuse(h.src, true)
			time.Sleep(100 * time.Millisecond) // several commit ticks, all failing
			n0 := h.consumed.Load()
			time.Sleep(300 * time.Millisecond)
			grew := h.consumed.Load() - n0
			require.LessOrEqual(t, grew, int64(20), "read %d records while no commit landed", grew)
			refuse(h.src, false)
			waitFor(t, "reading to resume once commits land", func() bool { return h.consumed.Load() > n0+grew+1000 })
			h.rt.Stop()
			r := wait()
			require.Equal(t, pipeline.Stopped, r.State, "%v", r.Failure)
		})
	}
}
