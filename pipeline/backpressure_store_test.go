package pipeline_test

import (
	"testing"
	"time"

	"github.com/spate-go/spate/pipeline"
)

// A store that refuses commits stops the reading after a bounded amount:
// acknowledgments still advance the watermark (so the pending-batch
// ceiling never engages), but nothing read past the last commit that
// landed may exceed MaxUncommittedBytes. Once commits land again, reading
// resumes.
func TestUncommittedBytesCeilingStopsReadingWhileCommitsFail(t *testing.T) {
	cfg := testConfig()
	cfg.MaxUncommittedBytes = 2000
	h := newHarness(t, cfg, modeOK, 0, assign(laneSpec{id: 0, part: 0, forever: true}))
	h.src.failCommits.Store(true)
	wait := h.run()
	// Every value is "v<offset>": at least 2 bytes, so 2000 bytes are at
	// most 1000 records, plus the batch (10 records) that crossed it.
	const most = 2000/2 + 10
	waitFor(t, "reading to start", func() bool { return h.consumed.Load() > 0 })
	var plateau int64
	for range 3 {
		time.Sleep(150 * time.Millisecond) // many commit ticks, all failing
		n := h.consumed.Load()
		if n > most {
			t.Fatalf("read %d records while no commit landed; the ceiling allows at most %d", n, most)
		}
		plateau = n
	}
	if h.src.pauseCount() != 0 {
		t.Fatal("the ceiling paused the source")
	}
	h.src.failCommits.Store(false)
	waitFor(t, "reading to resume once commits land", func() bool { return h.consumed.Load() > plateau+3*most })
	h.rt.Stop()
	if r := wait(); r.State != pipeline.Completed {
		t.Fatalf("state %v: %v", r.State, r.Failure)
	}
}
