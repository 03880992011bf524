package pipeline_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan pipeline.ExitReport, 1)
	go func() {
		r, _ := rt.Run(t.Context())
		ch <- r
	}()
	return rt, func() pipeline.ExitReport {
		select {
		case r := <-ch:
			if r.UnresolvedAcks != 0 {
				t.Errorf("%d acknowledgment handles leaked", r.UnresolvedAcks)
			}
			return r
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return")
			return pipeline.ExitReport{}
		}
	}
}

func offsetOf(r pipeline.Record) int64 {
	n, _ := strconv.ParseInt(strings.TrimPrefix(strings.ToLower(string(r.Value)), "v"), 10, 64)
	return n
}

// Stages, fan-out to shards, durable acks and commits end to end: every
// record a filter keeps reaches the sink, and the Drained exit commits the
// end of every partition.
func TestRealChainDeliversAndCommitsEverything(t *testing.T) {
	cfg := testConfig()
	cfg.Threads = 2
	sink := &pipeline.CaptureSink{}
	reg := prometheus.NewRegistry()
	var src *fakeSource
	src = newFakeSource(&eventLog{},
		assign(lane(0, 0, 20), lane(1, 1, 20), lane(2, 2, 20)),
		waitUntil(func() bool { return sink.Len() >= 3*200-3*20 }),
		drained())
	stages := []pipeline.Stage{
		pipeline.Map("upper", pipeline.Fail, func(r pipeline.Record) (pipeline.Record, error) {
			r.Value = bytes.ToUpper(r.Value)
			return r, nil
		}),
		pipeline.Filter("drop-tens", pipeline.Skip, func(r pipeline.Record) (bool, error) {
			if r.Offset%10 == 3 {
				return false, errors.New("offsets ending in 3 are malformed")
			}
			return true, nil
		}),
	}
	_, wait := startReal(t, cfg, src, stages, reg, pipeline.SinkSpec{Name: "capture", Sink: sink, Options: realSinkOptions()})
	r := wait()
	if r.State != pipeline.Completed {
		t.Fatalf("state %v: %v", r.State, r.Failure)
	}
	seen := map[[2]int64]int{}
	for _, rec := range sink.Records() {
		if !bytes.HasPrefix(rec.Value, []byte("V")) {
			t.Fatalf("record %q missed the map stage", rec.Value)
		}
		seen[[2]int64{int64(rec.Partition), offsetOf(rec)}]++
	}
	for p := range 3 {
		for o := range int64(200) {
			n := seen[[2]int64{int64(p), o}]
			if o%10 == 3 && n != 0 {
				t.Fatalf("skipped record p%d/%d was delivered", p, o)
			}
			if o%10 != 3 && n == 0 {
				t.Fatalf("record p%d/%d never reached the sink", p, o)
			}
		}
		if got, _ := src.committed(pipeline.PartitionID(p)); got != 200 {
			t.Fatalf("partition %d committed %d, want 200", p, got)
		}
	}
	skipped := gathered(t, reg, "spate_transform_record_errors_total", "policy", "skip")
	if skipped != 60 {
		t.Fatalf("skip counter %v, want 60", skipped)
	}
}

// gathered is the value of a gathered series found by name and one label.
func gathered(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	v, ok, err := promtest.Value(reg, name, label, value)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatalf("series %s{%s=%q} not found", name, label, value)
	}
	return v
}

// A Fail-policy error stops the pipeline; nothing past the failed batch
// commits.
func TestFailPolicyStopsThePipeline(t *testing.T) {
	sink := &pipeline.CaptureSink{}
	src := newFakeSource(&eventLog{}, assign(lane(0, 0, 5)))
	stages := []pipeline.Stage{pipeline.Map("parse", pipeline.Fail, func(r pipeline.Record) (pipeline.Record, error) {
		if r.Offset == 25 {
			return r, errors.New("unparseable")
		}
		return r, nil
	})}
	_, wait := startReal(t, testConfig(), src, stages, nil, pipeline.SinkSpec{Name: "c", Sink: sink, Options: realSinkOptions()})
	r := wait()
	if r.State != pipeline.Failed || r.Failure.Component != "transform:parse" {
		t.Fatalf("report %+v", r.Failure)
	}
	if o, ok := src.committed(0); ok && o > 20 {
		t.Fatalf("committed %d past the failed batch (20..29)", o)
	}
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
	if r := wait(); r.State != pipeline.Completed {
		t.Fatalf("state %v: %v", r.State, r.Failure)
	}
	if o, _ := src.committed(0); o != 30 {
		t.Fatalf("committed %d", o)
	}
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
	if r.State != pipeline.Failed || r.Failure.Component != "checkpoint" || !strings.Contains(r.Failure.Reason, "abandoned") {
		t.Fatalf("report %+v", r.Failure)
	}
	if _, ok := src.committed(0); ok {
		t.Fatal("an abandoned batch was committed")
	}
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
	if r.State != pipeline.Stopped || r.SinkDrain == nil || r.SinkDrain.Abandoned == 0 {
		t.Fatalf("report %+v drain %+v", r, r.SinkDrain)
	}
	if time.Since(start) > 15*time.Second {
		t.Fatal("the drain wedged")
	}
	if _, ok := src.committed(0); ok {
		t.Fatal("nothing was durable, nothing may commit")
	}
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

// The file sink writes one line per record and is durable before it acks.
func TestFileSinkWritesLines(t *testing.T) {
	dir := t.TempDir()
	fs, err := pipeline.NewFileSink(dir, "out")
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	var src *fakeSource
	src = newFakeSource(&eventLog{}, assign(lane(0, 0, 3), lane(1, 1, 3)),
		waitUntil(func() bool { o0, _ := src.committed(0); o1, _ := src.committed(1); return o0 == 30 && o1 == 30 }),
		drained())
	_, wait := startReal(t, testConfig(), src, nil, nil, pipeline.SinkSpec{Name: "file", Sink: fs, Options: realSinkOptions()})
	if r := wait(); r.State != pipeline.Completed {
		t.Fatalf("state %v: %v", r.State, r.Failure)
	}
	lines := 0
	for shard := range 2 {
		f, err := os.Open(fs.Path(shard))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if !strings.HasPrefix(sc.Text(), "\tv") {
				t.Fatalf("line %q", sc.Text())
			}
			lines++
		}
		f.Close()
	}
	if lines != 60 {
		t.Fatalf("%d lines, want 60", lines)
	}
}

// A write larger than FileSink's buffer goes out in pieces: every line of
// every chunk lands once, in order, and a second write appends after it.
func TestFileSinkWritesLargeBatchesInOrder(t *testing.T) {
	fs, err := pipeline.NewFileSink(t.TempDir(), "big")
	require.NoError(t, err)
	defer fs.Close()
	value := bytes.Repeat([]byte("x"), 300)
	batch := func(first, n int) [][]pipeline.Record {
		var chunks [][]pipeline.Record
		for off := first; off < first+n; off += 1000 {
			var c []pipeline.Record
			for o := off; o < min(off+1000, first+n); o++ {
				c = append(c, pipeline.Record{Key: []byte(strconv.Itoa(o)), Value: value, Offset: int64(o)})
			}
			chunks = append(chunks, c)
		}
		return chunks
	}
	// About 1.5 MiB and then 0.3 MiB of lines: several pieces each.
	require.NoError(t, fs.WriteChunks(t.Context(), 0, batch(0, 5000)))
	require.NoError(t, fs.WriteChunks(t.Context(), 0, batch(5000, 1000)))
	data, err := os.ReadFile(fs.Path(0))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	require.Len(t, lines, 6000)
	for i, line := range lines {
		require.Equal(t, strconv.Itoa(i)+"\t"+string(value), line, "line %d", i)
	}
}

func TestHealthEndpoints(t *testing.T) {
	h := newHarness(t, testConfig(), modeOK, 0, assign(lane(0, 0, 1)))
	handler := h.rt.Handler(nil)
	code := func(path string) int {
		rec := newRecorder()
		handler.ServeHTTP(rec, mustRequest(path))
		return rec.code
	}
	if code("/readyz") != 503 {
		t.Fatal("ready before an assignment")
	}
	wait := h.run()
	waitFor(t, "readiness", func() bool { return code("/readyz") == 200 })
	if code("/healthz") != 200 || code("/metrics") != 404 || code("/nope") != 404 {
		t.Fatal("health endpoints")
	}
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
					if !durable[[2]int64{int64(p), o}] {
						t.Fatalf("partition %d committed %d past record %d, which never became durable", p, w, o)
					}
				}
			}
			t.Logf("final %v, %d records durable, state %v", rep.FinalWatermarks, len(durable), rep.State)
		})
	}
}
