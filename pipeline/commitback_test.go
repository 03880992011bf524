package pipeline_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
)

// A commit the staging sink covered only in part (no part rolled yet) is
// tried again by the sweep. When a later commit carried more and reported
// a failure that hid its landing (a store timeout, a lost reply), that
// retry must not commit the older, lower watermark: the coordinator
// refuses a watermark moved back as a source bug (Fatal), which stopped
// `spate backfill` workers to S3 on loaded machines. The fake coordinator
// here judges as the real one does: a commit below the last one that
// landed is Fatal.
func TestDriverNeverCommitsBelowACommitThatMayHaveLanded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newDriverFixture(t)
		cut := int64(0)
		stage := &fakeStaging{cover: func(w int64, final bool) int64 {
			if final {
				return w
			}
			return min(cut, w)
		}}
		require.NoError(t, f.d.StageOutput(stage))
		lostReply := false
		f.coord.commitErr = func(s spate.SplitID, p spate.SplitProgress) error {
			// Called with the coordinator's lock held.
			landed := f.coord.commits[s.String()]
			if n := len(landed); n > 0 && p.Watermark < landed[n-1].Watermark {
				return spate.Fatalf("commit of split %s would move its committed watermark back from %d to %d", s, landed[n-1].Watermark, p.Watermark)
			}
			if lostReply {
				lostReply = false
				f.coord.commits[s.String()] = append(landed, p)
				return spate.Retryablef("etcd: update durable %q: context deadline exceeded", s)
			}
			return nil
		}
		f.coord.push(gained("a", 1))
		f.expect(pipeline.LanesAdded)
		pa := f.partitionOf("a")

		// Acknowledged to 5, no part cut: nothing to commit, the sweep
		// tries 5 again later.
		require.NoError(t, f.d.Commit(f.src, []pipeline.Watermark{{Partition: pa, Offset: 5}}))
		require.Empty(t, f.coord.commits["a"])
		// Acknowledged to 8 and a part cut to 8: its commit lands, but the coordination
		// driver hears a timeout (deferred, the controller retries it).
		cut, lostReply = 8, true
		require.NoError(t, f.d.Commit(f.src, []pipeline.Watermark{{Partition: pa, Offset: 8}}))
		got, cause := f.d.TakeDeferred()
		require.ErrorContains(t, cause, "deadline exceeded")
		require.Equal(t, []pipeline.PartitionID{pa}, got, "the commit that timed out is deferred")
		require.Len(t, f.coord.commits["a"], 1, "the commit of 8 landed")

		// The sweep's retry of the short commit is due.
		time.Sleep(time.Second)
		for range 3 {
			f.poll() // fails on a Fatal from the coordinator
		}
		for _, p := range f.coord.commits["a"] {
			require.EqualValues(t, 8, p.Watermark, "commits %v: a commit moved the watermark back or past what was acknowledged", f.coord.commits["a"])
		}
		require.Contains(t, stage.prepares, "8/false")
		require.NotContains(t, stage.prepares[2:], "5/false", "the sweep prepared the stale watermark again")
	})
}
