package pipeline_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/pipeline"
)

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
	require.Equal(t, pipeline.Failed, r.State, "report %+v", r.Failure)
	require.NotNil(t, r.Failure)
	require.Equal(t, "transform:parse", r.Failure.Component, "report %+v", r.Failure)
	if o, ok := src.committed(0); ok {
		require.LessOrEqual(t, o, int64(20), "committed past the failed batch (20..29)")
	}
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
	require.Equal(t, pipeline.Completed, r.State, "failure: %v", r.Failure)
	seen := map[[2]int64]int{}
	for _, rec := range sink.Records() {
		require.True(t, bytes.HasPrefix(rec.Value, []byte("V")), "record %q missed the map stage", rec.Value)
		seen[[2]int64{int64(rec.Partition), offsetOf(rec)}]++
	}
	for p := range 3 {
		for o := range int64(200) {
			n := seen[[2]int64{int64(p), o}]
			if o%10 == 3 {
				require.Zero(t, n, "skipped record p%d/%d was delivered", p, o)
			} else {
				require.NotZero(t, n, "record p%d/%d never reached the sink", p, o)
			}
		}
		got, _ := src.committed(pipeline.PartitionID(p))
		require.EqualValues(t, 200, got, "partition %d committed", p)
	}
	skipped := gathered(t, reg, "spate_transform_record_errors_total", "policy", "skip")
	require.Equal(t, 60.0, skipped, "skip counter")
}

// FlatMap emits every record it is given as many times as it says, and
// the chain hands each surviving record to every sink exactly once: both
// sinks of a run see each emitted record once, none lost, none twice.
func TestFlatMapFansEveryRecordOutToEverySink(t *testing.T) {
	a, b := &pipeline.CaptureSink{}, &pipeline.CaptureSink{}
	var src *fakeSource
	src = newFakeSource(&eventLog{},
		assign(lane(0, 0, 5), lane(1, 1, 5)),
		waitUntil(func() bool { return a.Len() >= 2*2*50 && b.Len() >= 2*2*50 }),
		drained())
	stages := []pipeline.Stage{
		pipeline.FlatMap("twice", pipeline.Fail, func(r pipeline.Record, emit func(pipeline.Record)) error {
			for _, tag := range []string{"x", "y"} {
				out := r
				out.Key = []byte(tag)
				emit(out)
			}
			return nil
		}),
	}
	_, wait := startReal(t, testConfig(), src, stages, nil,
		pipeline.SinkSpec{Name: "a", Sink: a, Options: realSinkOptions()},
		pipeline.SinkSpec{Name: "b", Sink: b, Options: realSinkOptions()})
	r := wait()
	require.Equal(t, pipeline.Completed, r.State, "failure: %v", r.Failure)
	for name, sink := range map[string]*pipeline.CaptureSink{"a": a, "b": b} {
		seen := map[string]int{}
		for _, rec := range sink.Records() {
			seen[fmt.Sprintf("%d/%d/%s", rec.Partition, offsetOf(rec), rec.Key)]++
		}
		lost, dup := 0, 0
		for p := range 2 {
			for o := range 50 {
				for _, tag := range []string{"x", "y"} {
					switch n := seen[fmt.Sprintf("%d/%d/%s", p, o, tag)]; {
					case n == 0:
						lost++
					case n > 1:
						dup += n - 1
					}
				}
			}
		}
		assert.Zero(t, lost, "sink %s lost records", name)
		assert.Zero(t, dup, "sink %s got duplicates", name)
		assert.Len(t, seen, 2*50*2, "sink %s got records nobody emitted", name)
	}
	for p := range 2 {
		got, _ := src.committed(pipeline.PartitionID(p))
		assert.EqualValues(t, 50, got, "partition %d commits the end of its input", p)
	}
}

// The names the metrics and logs use.
func TestErrorPolicyAndPushOutcomeNames(t *testing.T) {
	assert.Equal(t, "fail", pipeline.Fail.String())
	assert.Equal(t, "skip", pipeline.Skip.String())
	assert.Equal(t, "done", pipeline.PushOutcome{Kind: pipeline.PushDone}.String())
	assert.Equal(t, "blocked(at 7)", pipeline.PushOutcome{Kind: pipeline.PushBlocked, ResumeAt: 7}.String())
	assert.Equal(t, "fatal(sink:a: boom)", pipeline.PushOutcome{Kind: pipeline.PushFatal, Err: &pipeline.FatalError{Component: "sink:a", Reason: "boom"}}.String())
	assert.Equal(t, "parse", pipeline.Map("parse", pipeline.Fail, nil).Name())
}
