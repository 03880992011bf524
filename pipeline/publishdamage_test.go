package pipeline_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesink"
)

// countingStage counts the publishes of a staged file sink.
type countingStage struct {
	*filesink.StagedFileSink
	publishes atomic.Int64
}

func (c *countingStage) Publish(ctx context.Context, p pipeline.PartitionID, committable []byte) error {
	c.publishes.Add(1)
	return c.StagedFileSink.Publish(ctx, p, committable)
}

// A published file deleted while its split runs: its owner retried the
// publish forever (about 30 warnings a second) and the job waited. No
// retry can mend it (the bytes published before are gone with it), so the
// split is set aside: failed once through the coordinator with a reason
// naming the file, and never published again; the file is not recreated.
func TestDriverSetsASplitWithDeletedOutputAside(t *testing.T) {
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
			rs = append(rs, pipeline.Record{Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "line %d", i), Partition: pa, Offset: i})
		}
		require.NoError(t, sink.Write(context.Background(), 0, rs))
	}
	commit := func(w int64) {
		require.NoError(t, f.d.Commit(f.src, []pipeline.Watermark{{Partition: pa, Offset: w}}))
	}

	write(0, 4)
	commit(4)
	published := filepath.Join(dst, "a.out")
	require.FileExists(t, published)
	require.NoError(t, os.Remove(published))
	write(4, 8)
	commit(8) // won; its publish finds the file gone
	require.Len(t, f.coord.commits["a"], 2)
	after := stage.publishes.Load()
	for range 5 {
		_, err := f.d.PollEvents(f.src, 0)
		require.NoError(t, err)
		commit(8)
	}
	require.Equal(t, []string{"a"}, f.coord.fails, "the split is failed once, through the coordinator")
	require.Contains(t, f.coord.failReasons[0], published)
	require.Contains(t, f.coord.failReasons[0], "deleted under the job")
	require.Equal(t, after, stage.publishes.Load(), "publish retried after the damage was found")
	require.NoFileExists(t, published, "the published file was recreated")
}
