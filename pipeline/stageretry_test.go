package pipeline_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesink"
)

// flakyStage is a staged file sink whose OpenStage fails with err for its
// first failures calls, as a bucket or a disk with a passing fault does.
type flakyStage struct {
	*filesink.StagedFileSink
	failures int64
	err      error
	opens    atomic.Int64
}

func (f *flakyStage) OpenStage(ctx context.Context, t pipeline.StageTenancy, committed []byte) error {
	if f.opens.Add(1) <= f.failures {
		return f.err
	}
	return f.StagedFileSink.OpenStage(ctx, t, committed)
}

// A stage that cannot open for a passing fault (a Retryable error) is
// tried again, backing off, while the split stays held: no attempt is
// spent, nothing is set aside, and once the stage opens the split runs to
// completion with each record published once. Damage or a refusal still
// sets the split aside at once.
func TestDriverRetriesATransientStageFault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newDriverFixture(t)
		dst := t.TempDir()
		sink, err := filesink.NewStagedFileSink(dst, "")
		require.NoError(t, err)
		defer sink.Close()
		const failures = 4
		stage := &flakyStage{StagedFileSink: sink, failures: failures, err: spate.Retryablef("blob sink: cannot list the parts of split a: connection reset by peer")}
		require.NoError(t, f.d.StageOutput(stage))
		f.src.completeAt["a"] = 8
		f.coord.push(gained("a", 1))

		// Each poll parks until the next retry is due (virtual time), and
		// the stage opens at the attempt after the last failure.
		start := time.Now()
		var lanes int
		for polls := 0; lanes == 0; polls++ {
			require.Less(t, polls, 100, "the stage never opened: %d OpenStage calls", stage.opens.Load())
			ev, err := f.d.PollEvents(f.src, time.Minute)
			require.NoError(t, err)
			if ev.Kind == pipeline.LanesAdded {
				lanes += len(ev.Lanes)
			}
		}
		require.EqualValues(t, failures+1, stage.opens.Load(), "OpenStage calls")
		require.GreaterOrEqual(t, time.Since(start), 1500*time.Millisecond, "the retries did not back off (100+200+400+800 ms)")
		require.Empty(t, f.coord.fails, "a transient fault spent the split's attempts")

		pa := f.partitionOf("a")
		var rs []pipeline.Record
		var want strings.Builder
		for i := range 8 {
			rs = append(rs, pipeline.Record{Value: fmt.Appendf(nil, "line %d", i), Partition: pa, Offset: int64(i)})
			fmt.Fprintf(&want, "\tline %d\n", i) // key, tab, value
		}
		require.NoError(t, sink.Write(context.Background(), 0, rs))
		require.NoError(t, f.d.Commit(f.src, []pipeline.Watermark{{Partition: pa, Offset: 8}}))
		require.Len(t, f.coord.commits["a"], 2, "the output's commit and the completion")
		require.True(t, f.coord.commits["a"][1].Completed, "the split did not complete")
		got, err := os.ReadFile(filepath.Join(dst, "a.out"))
		require.NoError(t, err)
		require.Equal(t, want.String(), string(got), "published output")
		require.Empty(t, f.coord.fails)
	})
}

// A refusal (no class: not a passing fault) sets the split aside at once,
// spending one attempt, as before.
func TestDriverSetsAsideARefusedStage(t *testing.T) {
	f := newDriverFixture(t)
	sink, err := filesink.NewStagedFileSink(t.TempDir(), "")
	require.NoError(t, err)
	defer sink.Close()
	stage := &flakyStage{StagedFileSink: sink, failures: 1, err: fmt.Errorf("a.out already holds 12 bytes, but split a has no committed output")}
	require.NoError(t, f.d.StageOutput(stage))
	f.coord.push(gained("a", 1))
	ev := f.expect(pipeline.LanesAdded)
	require.Empty(t, ev.Lanes)
	require.Equal(t, []string{"a"}, f.coord.fails)
	require.Contains(t, f.coord.failReasons[0], "already holds 12 bytes")
	f.poll()
	require.EqualValues(t, 1, stage.opens.Load(), "a refused stage was tried again")
}

// A split whose stage waits out a transient fault is handed back at once
// when the coordinator wants it back: nothing was read from it.
func TestDriverHandsBackASplitWaitingForItsStage(t *testing.T) {
	f := newDriverFixture(t)
	sink, err := filesink.NewStagedFileSink(t.TempDir(), "")
	require.NoError(t, err)
	defer sink.Close()
	stage := &flakyStage{StagedFileSink: sink, failures: 1000, err: spate.Retryablef("connection reset by peer")}
	require.NoError(t, f.d.StageOutput(stage))
	f.coord.push(gained("a", 1))
	ev := f.expect(pipeline.LanesAdded)
	require.Empty(t, ev.Lanes)
	f.coord.push(spate.RevokeRequested{Split: sid("a")})
	f.poll()
	require.Equal(t, [][]spate.SplitID{{sid("a")}}, f.coord.releases, "the waiting split was not handed back")
	require.Empty(t, f.coord.declines)
	require.Empty(t, f.coord.fails)
	require.Empty(t, f.d.Assignments())
}
