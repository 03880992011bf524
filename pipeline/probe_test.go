package pipeline_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/pipeline"
)

// probingSink is a sink over a connection it can check: its probe answers
// once connected is closed.
type probingSink struct {
	*pipeline.CaptureSink
	connected chan struct{}
}

func (s probingSink) Probe(ctx context.Context) error {
	select {
	case <-s.connected:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

var _ pipeline.SinkProber = probingSink{}

// A sink with a probe holds readiness until the probe answers, even with
// an assignment and records flowing: /readyz is 503 until then, 200 after.
func TestReadinessWaitsForTheSinkProbe(t *testing.T) {
	capture := &pipeline.CaptureSink{}
	sink := probingSink{CaptureSink: capture, connected: make(chan struct{})}
	src := newFakeSource(&eventLog{}, assign(lane(0, 0, 1)))
	rt, wait := startReal(t, testConfig(), src, nil, nil, pipeline.SinkSpec{Name: "c", Sink: sink})
	handler := rt.Handler(nil)
	code := func(path string) int {
		rec := newRecorder()
		handler.ServeHTTP(rec, mustRequest(path))
		return rec.code
	}
	waitFor(t, "the lane's records written", func() bool { return capture.Len() > 0 })
	require.Equal(t, 503, code("/readyz"), "assigned and writing, but the sink's probe has not answered: not ready")
	close(sink.connected)
	waitFor(t, "readiness once the probe answers", func() bool { return code("/readyz") == 200 })
	rt.Stop()
	wait()
}
