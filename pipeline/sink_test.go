package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/promtest"
	"github.com/spate-go/spate/pipeline"
)

func realSinkOptions() pipeline.SinkOptions {
	return pipeline.SinkOptions{Shards: 2, QueueCapacity: 4, ChunkTargetBytes: 256, Linger: 2 * time.Millisecond,
		RetryInitial: time.Millisecond, RetryMax: 5 * time.Millisecond}
}

func startReal(t *testing.T, cfg pipeline.Config, src pipeline.Source, stages []pipeline.Stage, reg prometheus.Registerer, sinks ...pipeline.SinkSpec) (*pipeline.Runtime, func() pipeline.ExitReport) {
	t.Helper()
	var opts []pipeline.Option
	if reg != nil {
		opts = append(opts, pipeline.WithRegisterer(reg))
	}
	rt, err := pipeline.Build(cfg, src, stages, sinks, opts...)
	require.NoError(t, err)
	ch := make(chan pipeline.ExitReport, 1)
	go func() {
		r, _ := rt.Run(t.Context())
		ch <- r
	}()
	return rt, func() pipeline.ExitReport {
		select {
		case r := <-ch:
			assert.Zero(t, r.UnresolvedAcks, "acknowledgment handles leaked")
			return r
		case <-time.After(30 * time.Second):
			require.FailNow(t, "Run did not return")
			return pipeline.ExitReport{}
		}
	}
}

func offsetOf(r pipeline.Record) int64 {
	n, _ := strconv.ParseInt(strings.TrimPrefix(strings.ToLower(string(r.Value)), "v"), 10, 64)
	return n
}

// gathered is the value of a gathered series found by name and one label.
func gathered(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	v, ok, err := promtest.Value(reg, name, label, value)
	require.NoError(t, err)
	require.True(t, ok, "series %s{%s=%q} not found", name, label, value)
	return v
}

// Retryable sink errors are retried until the write lands.
func TestSinkRetriesThenDelivers(t *testing.T) {
	var failures atomic.Int32
	sink := &pipeline.CaptureSink{Fail: func(int, []pipeline.Record) error {
		if failures.Add(1) <= 3 {
			return errors.New("connection reset")
		}
		return nil
	}}
	var src *fakeSource
	src = newFakeSource(&eventLog{}, assign(lane(0, 0, 3)),
		waitUntil(func() bool { return sink.Len() == 30 }), drained())
	_, wait := startReal(t, testConfig(), src, nil, nil, pipeline.SinkSpec{Name: "c", Sink: sink, Options: realSinkOptions()})
	r := wait()
	require.Equal(t, pipeline.Completed, r.State, "failure: %v", r.Failure)
	o, _ := src.committed(0)
	require.EqualValues(t, 30, o, "committed")
}

// A fatal sink error abandons the batch: its acknowledgment fails, the
// partition stalls and the stall fails the pipeline, naming the sink.
func TestFatalSinkErrorStallsAndFails(t *testing.T) {
	sink := &pipeline.CaptureSink{Fail: func(int, []pipeline.Record) error {
		return fmt.Errorf("table dropped: %w", spate.ErrFatal)
	}}
	cfg := testConfig()
	cfg.StalledFailAfter = 50 * time.Millisecond
	src := newFakeSource(&eventLog{}, assign(lane(0, 0, 3)))
	_, wait := startReal(t, cfg, src, nil, nil, pipeline.SinkSpec{Name: "c", Sink: sink, Options: realSinkOptions()})
	r := wait()
	require.Equal(t, pipeline.Failed, r.State, "report %+v", r.Failure)
	require.NotNil(t, r.Failure)
	require.Equal(t, "checkpoint", r.Failure.Component, "report %+v", r.Failure)
	require.Contains(t, r.Failure.Reason, "abandoned", "report %+v", r.Failure)
	_, ok := src.committed(0)
	require.False(t, ok, "an abandoned batch was committed")
}

// ★ drain wedge: a sink that is down for good still lets a shutdown finish
// within its bound; its batches are abandoned (their data replays).
func TestDownSinkDoesNotWedgeTheDrain(t *testing.T) {
	sink := &pipeline.CaptureSink{Fail: func(int, []pipeline.Record) error { return errors.New("down") }}
	cfg := testConfig()
	cfg.DrainTimeout = time.Second
	src := newFakeSource(&eventLog{}, assign(lane(0, 0, 3)))
	rt, wait := startReal(t, cfg, src, nil, nil, pipeline.SinkSpec{Name: "c", Sink: sink, Options: realSinkOptions()})
	waitFor(t, "failing writes", func() bool { return sink.Writes() >= 3 })
	start := time.Now()
	rt.Stop()
	r := wait()
	require.Equal(t, pipeline.Stopped, r.State, "report %+v", r)
	require.NotNil(t, r.SinkDrain, "report %+v", r)
	require.NotZero(t, r.SinkDrain.Abandoned, "drain %+v", r.SinkDrain)
	require.LessOrEqual(t, time.Since(start), 15*time.Second, "the drain wedged")
	_, ok := src.committed(0)
	require.False(t, ok, "nothing was durable, nothing may commit")
}

// stallingSink is a CaptureSink whose writes first call stall, outside the
// capture's lock, so a source polling Len never waits on a stuck write.
type stallingSink struct {
	*pipeline.CaptureSink
	stall func()
}

func (s stallingSink) Write(ctx context.Context, shard int, records []pipeline.Record) error {
	s.stall()
	return s.CaptureSink.Write(ctx, shard, records)
}

// Full queues block the chain, which pauses the source, and everything is
// still delivered once the sink catches up. The batches are small, so the
// stuck write and the full batch waiting behind it hold few records: the
// queue stays full while the lane has plenty more, longer than the
// runner's grace for a momentarily full queue.
func TestFullQueuesBackpressure(t *testing.T) {
	release := make(chan struct{})
	capture := &pipeline.CaptureSink{}
	sink := stallingSink{CaptureSink: capture, stall: func() { <-release }}
	var src *fakeSource
	src = newFakeSource(&eventLog{}, assign(lane(0, 0, 50)),
		waitUntil(func() bool { return capture.Len() == 500 }), drained())
	opts := pipeline.SinkOptions{Shards: 1, QueueCapacity: 1, ChunkTargetBytes: 64, Linger: time.Millisecond, BatchMaxRecords: 10}
	_, wait := startReal(t, testConfig(), src, nil, nil, pipeline.SinkSpec{Name: "c", Sink: sink, Options: opts})
	waitFor(t, "a backpressure pause", func() bool { return src.pauseCount() > 0 })
	close(release)
	r := wait()
	require.Equal(t, pipeline.Completed, r.State, "failure: %v", r.Failure)
	src.mu.Lock()
	resumes := len(src.resumes)
	src.mu.Unlock()
	require.NotZero(t, resumes, "a paused source must be resumed")
}

func TestHealthEndpoints(t *testing.T) {
	h := newHarness(t, testConfig(), modeOK, 0, assign(lane(0, 0, 1)))
	handler := h.rt.Handler(nil)
	code := func(path string) int {
		rec := newRecorder()
		handler.ServeHTTP(rec, mustRequest(path))
		return rec.code
	}
	require.Equal(t, 503, code("/readyz"), "ready before an assignment")
	wait := h.run()
	waitFor(t, "readiness", func() bool { return code("/readyz") == 200 })
	require.Equal(t, 200, code("/healthz"), "health endpoints")
	require.Equal(t, 404, code("/metrics"), "health endpoints")
	require.Equal(t, 404, code("/nope"), "health endpoints")
	h.rt.Stop()
	wait()
}

var _ = context.Background

// INV-1 end to end: with a sink that randomly abandons batches (fatal
// write errors) and randomly fails retryably, no committed watermark ever
// passes a record that is not durable in the sink, and every
// acknowledgment resolves.
func TestWatermarkNeverPassesUndurableData(t *testing.T) {
	for seed := range uint64(5) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 7))
			var mu sync.Mutex
			sink := &pipeline.CaptureSink{Fail: func(int, []pipeline.Record) error {
				mu.Lock()
				defer mu.Unlock()
				switch n := r.IntN(20); {
				case n == 0:
					return fmt.Errorf("poison batch: %w", spate.ErrFatal)
				case n < 4:
					return errors.New("timeout")
				}
				return nil
			}}
			cfg := testConfig()
			cfg.Threads = 2
			var src *fakeSource
			src = newFakeSource(&eventLog{}, assign(lane(0, 0, 30), lane(1, 1, 30), lane(2, 2, 30), lane(3, 3, 30)))
			opts := pipeline.SinkOptions{Shards: 3, QueueCapacity: 2, ChunkTargetBytes: 64, Linger: time.Millisecond,
				RetryInitial: time.Millisecond, RetryMax: 2 * time.Millisecond}
			rt, wait := startReal(t, cfg, src, nil, nil, pipeline.SinkSpec{Name: "flaky", Sink: sink, Options: opts})
			waitFor(t, "every lane polled dry", func() bool {
				lanes := src.laneList()
				for _, l := range lanes {
					l.mu.Lock()
					done := l.next == len(l.batches)
					l.mu.Unlock()
					if !done {
						return false
					}
				}
				return len(lanes) == 4
			})
			rt.Stop()
			rep := wait()
			durable := map[[2]int64]bool{}
			for _, rec := range sink.Records() {
				durable[[2]int64{int64(rec.Partition), offsetOf(rec)}] = true
			}
			for p := range 4 {
				w, _ := src.committed(pipeline.PartitionID(p))
				for o := range w {
					require.True(t, durable[[2]int64{int64(p), o}], "partition %d committed %d past record %d, which never became durable", p, w, o)
				}
			}
			t.Logf("final %v, %d records durable, state %v", rep.FinalWatermarks, len(durable), rep.State)
		})
	}
}
