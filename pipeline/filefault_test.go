package pipeline_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesink"
	"github.com/spate-go/spate/pipeline/internal/filehook"
)

// The staged file sink marks its faults (filesink/filefault.go): a disk fault that
// passes keeps the split held and its stage is retried with backoff; a
// refusal no retry mends sets the split aside with an error naming the
// path and the fix. Before, every fault was unmarked: a passing one at
// OpenStage set the split aside (spending an attempt), and one at publish
// that never passes was retried forever.

// stageLines writes lines 0..n-1 of split to a staged file sink at dst
// as a first owner would, and returns the committable it would commit:
// the record of a commit whose publish never ran.
func stageLines(t *testing.T, dst, split string, n int64) []byte {
	t.Helper()
	ctx := context.Background()
	sink, err := filesink.NewStagedFileSink(dst, "")
	require.NoError(t, err)
	defer sink.Close()
	const p = pipeline.PartitionID(99)
	require.NoError(t, sink.OpenStage(ctx, pipeline.StageTenancy{Split: sid(split), Epoch: 1, Partition: p}, nil))
	var rs []pipeline.Record
	for i := range n {
		rs = append(rs, pipeline.Record{Value: fmt.Appendf(nil, "line %d", i), Partition: p, Offset: i})
	}
	require.NoError(t, sink.Write(ctx, 0, rs))
	out, covered, _, err := sink.Prepare(ctx, p, n, false)
	require.NoError(t, err)
	require.Equal(t, n, covered)
	return out
}

// A takeover whose stage must first publish what the last owner
// committed, on a disk that fails that write with EIO three times: the
// split stays held (no attempt spent), the stage is retried with backoff,
// and once the disk answers every line is published exactly once.
func TestTransientDiskFaultAtOpenStageIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dst := t.TempDir()
		committed := stageLines(t, dst, "a", 4)
		const failures = 3
		var writes atomic.Int64
		defer filehook.SetPublishWriteForTest(func(out *os.File, off, n int64, write func() error) error {
			if writes.Add(1) <= failures {
				return &os.PathError{Op: "write", Path: out.Name(), Err: syscall.EIO}
			}
			return write()
		})()

		f := newDriverFixture(t)
		sink, err := filesink.NewStagedFileSink(dst, "")
		require.NoError(t, err)
		defer sink.Close()
		require.NoError(t, f.d.StageOutput(sink))
		f.src.completeAt["a"] = 8
		progress := spate.SplitProgress{Watermark: 4, Output: committed}
		f.coord.push(spate.Gained{Split: spate.NewSplitSpec(sid("a"), []byte("a")), Epoch: 2, Progress: &progress})

		start := time.Now()
		var lanes int
		for polls := 0; lanes == 0; polls++ {
			require.Less(t, polls, 100, "the stage never opened: %d publish writes; splits failed: %v %v", writes.Load(), f.coord.fails, f.coord.failReasons)
			require.Empty(t, f.coord.fails, "a passing disk fault set the split aside: %v", f.coord.failReasons)
			ev, err := f.d.PollEvents(f.src, time.Minute)
			require.NoError(t, err)
			if ev.Kind == pipeline.LanesAdded {
				lanes += len(ev.Lanes)
			}
		}
		require.EqualValues(t, failures+1, writes.Load(), "publish writes")
		require.GreaterOrEqual(t, time.Since(start), 700*time.Millisecond, "the retries did not back off (100+200+400 ms)")
		require.Empty(t, f.coord.fails, "a passing disk fault spent the split's attempts")

		pa := f.partitionOf("a")
		var rs []pipeline.Record
		var want strings.Builder
		for i := range int64(8) {
			fmt.Fprintf(&want, "\tline %d\n", i)
			if i >= 4 {
				rs = append(rs, pipeline.Record{Value: fmt.Appendf(nil, "line %d", i), Partition: pa, Offset: i})
			}
		}
		require.NoError(t, sink.Write(context.Background(), 0, rs))
		require.NoError(t, f.d.Commit(f.src, []pipeline.Watermark{{Partition: pa, Offset: 8}}))
		require.True(t, f.coord.commits["a"][len(f.coord.commits["a"])-1].Completed, "the split did not complete")
		got, err := os.ReadFile(filepath.Join(dst, "a.out"))
		require.NoError(t, err)
		require.Equal(t, want.String(), string(got), "published output: each line once")
	})
}

// A stage that cannot open for a refusal no retry mends (a file where
// the split's staging directory belongs: ENOTDIR) sets the split aside at once,
// with a reason naming the path and the fix.
func TestRefusedStageDirectorySetsTheSplitAsideNamingThePath(t *testing.T) {
	dst := t.TempDir()
	f := newDriverFixture(t)
	sink, err := filesink.NewStagedFileSink(dst, "")
	require.NoError(t, err)
	defer sink.Close()
	blocker := filepath.Join(dst, ".spate", "stage", "a")
	require.NoError(t, os.MkdirAll(filepath.Dir(blocker), 0o755))
	require.NoError(t, os.WriteFile(blocker, []byte("not a directory"), 0o644))
	require.NoError(t, f.d.StageOutput(sink))
	f.coord.push(gained("a", 1))
	ev := f.expect(pipeline.LanesAdded)
	require.Empty(t, ev.Lanes)
	require.Equal(t, []string{"a"}, f.coord.fails, "the split is set aside once")
	reason := f.coord.failReasons[0]
	require.Contains(t, reason, blocker, "the reason names the path")
	require.Contains(t, reason, "that must be a directory is a file: move that file away", "the reason says what to fix")
}

// A publish refused for good (the destination's filesystem turned
// read-only under the job) sets the split aside once, naming the file and
// the fix, instead of being retried forever.
func TestReadOnlyDestinationAtPublishSetsTheSplitAside(t *testing.T) {
	f := newDriverFixture(t)
	dst := t.TempDir()
	sink, err := filesink.NewStagedFileSink(dst, "")
	require.NoError(t, err)
	defer sink.Close()
	stage := &countingStage{StagedFileSink: sink}
	require.NoError(t, f.d.StageOutput(stage))
	f.coord.push(gained("a", 1))
	f.expect(pipeline.LanesAdded)
	pa := f.partitionOf("a")
	write := func(from, to int64) {
		var rs []pipeline.Record
		for i := from; i < to; i++ {
			rs = append(rs, pipeline.Record{Value: fmt.Appendf(nil, "line %d", i), Partition: pa, Offset: i})
		}
		require.NoError(t, sink.Write(context.Background(), 0, rs))
	}
	commit := func(w int64) {
		require.NoError(t, f.d.Commit(f.src, []pipeline.Watermark{{Partition: pa, Offset: w}}))
	}
	write(0, 4)
	commit(4)
	published := filepath.Join(dst, "a.out")
	defer filehook.SetPublishWriteForTest(func(out *os.File, off, n int64, write func() error) error {
		return &os.PathError{Op: "write", Path: out.Name(), Err: syscall.EROFS}
	})()
	write(4, 8)
	commit(8) // won; its publish is refused
	after := stage.publishes.Load()
	for range 5 {
		_, err := f.d.PollEvents(f.src, 0)
		require.NoError(t, err)
		commit(8)
	}
	require.Equal(t, []string{"a"}, f.coord.fails, "the split is set aside once, through the coordinator")
	require.Contains(t, f.coord.failReasons[0], published, "the reason names the file")
	require.Contains(t, f.coord.failReasons[0], "is read-only: remount it read-write", "the reason says what to fix")
	require.Equal(t, after, stage.publishes.Load(), "a refused publish was retried")
}
