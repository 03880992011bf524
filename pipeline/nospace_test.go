package pipeline_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/pipeline"
)

// fullDiskSink fails every write as a full disk does.
type fullDiskSink struct{ writes atomic.Int32 }

func (s *fullDiskSink) Write(context.Context, int, []pipeline.Record) error {
	s.writes.Add(1)
	return fmt.Errorf("file sink: write shard 0: %w",
		&os.PathError{Op: "write", Path: "/data/out/part-0", Err: syscall.ENOSPC})
}

func (s *fullDiskSink) Destination() string { return "/data/out" }

// A sink out of space fails the pipeline after a bounded number of
// attempts, with an error naming the destination, instead of retrying
// until the drain deadline while the disk stays full.
func TestNoSpaceLeftFailsThePipelineAfterBoundedRetries(t *testing.T) {
	sink := &fullDiskSink{}
	opts := pipeline.SinkOptions{Shards: 2, QueueCapacity: 4, ChunkTargetBytes: 256, Linger: 2 * time.Millisecond}
	// Default backoff (100ms doubling) and the default 5 attempts.
	src := newFakeSource(&eventLog{}, assign(laneSpec{id: 0, part: 0, forever: true}))
	start := time.Now()
	_, wait := startReal(t, testConfig(), src, nil, nil, pipeline.SinkSpec{Name: "file", Sink: sink, Options: opts})
	r := wait()
	took := time.Since(start)
	require.Equal(t, pipeline.Failed, r.State, "state %v, failure %v", r.State, r.Failure)
	require.NotNil(t, r.Failure, "state %v, failure %v", r.State, r.Failure)
	for _, want := range []string{"no space left on device", "/data/out", `sink "file"`, "5 attempts"} {
		assert.Contains(t, r.Failure.Error(), want, "failure %q does not mention %q", r.Failure.Error(), want)
	}
	// 100+200+400+800ms of backoff (±20%), then the drain: well under the
	// 3s drain timeout plus the stall limit the run would otherwise need.
	require.LessOrEqual(t, took, 4*time.Second, "the run took %v to fail", took)
	// Each of two shards tries its batch at most 5 times; once the sink
	// failed nothing more is written.
	n := sink.writes.Load()
	require.LessOrEqual(t, n, int32(2*5), "%d writes; at most 10 expected", n)
	_, ok := src.committed(0)
	require.False(t, ok, "a batch that was never written was committed")
	t.Logf("failed in %v after %d writes: %v", took, sink.writes.Load(), r.Failure)
}
