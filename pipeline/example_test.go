package pipeline_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/spate-go/spate/pipeline"
)

// wordsLane serves a fixed list of words, one batch per poll.
type wordsLane struct {
	words  []string
	next   int
	issuer *pipeline.AckIssuer
	done   *atomic.Bool
}

func (l *wordsLane) ID() pipeline.LaneID             { return 0 }
func (l *wordsLane) Partition() pipeline.PartitionID { return 0 }

func (l *wordsLane) Poll(max int, timeout time.Duration) (*pipeline.Batch, error) {
	if l.next == len(l.words) {
		l.done.Store(true) // decided on an empty poll after the last batch
		time.Sleep(timeout)
		return nil, nil
	}
	b := &pipeline.Batch{}
	for ; l.next < len(l.words) && len(b.Payloads) < max; l.next++ {
		b.Payloads = append(b.Payloads, pipeline.RawPayload{Value: []byte(l.words[l.next]), Offset: int64(l.next)})
	}
	b.Ack = l.issuer.Issue(0, int64(l.next-1))
	return b, nil
}

// wordsSource is a bounded source: one lane, then Drained.
type wordsSource struct {
	pipeline.BaseSource
	words    []string
	issuer   *pipeline.AckIssuer
	assigned bool
	done     atomic.Bool
}

func (s *wordsSource) Open(ctx pipeline.SourceCtx) error { s.issuer = ctx.Issuer; return nil }

func (s *wordsSource) PollEvents(timeout time.Duration) (pipeline.SourceEvent, error) {
	switch {
	case !s.assigned:
		s.assigned = true
		return pipeline.AssignedEvent(&wordsLane{words: s.words, issuer: s.issuer, done: &s.done}), nil
	case s.done.Load():
		return pipeline.DrainedEvent(), nil
	}
	time.Sleep(timeout)
	return pipeline.IdleEvent(), nil
}

func (s *wordsSource) Commit(ws []pipeline.Watermark) error {
	for _, w := range ws {
		fmt.Printf("commit partition %d at %d\n", w.Partition, w.Offset)
	}
	return nil
}

// A bounded pipeline: a map and a filter stage into a capture sink. The
// run ends on its own once the source is drained, and its Completed exit
// means every record was acknowledged and committed.
func ExampleBuild() {
	src := &wordsSource{words: []string{"alpha", "beta", "gamma", "delta"}}
	sink := &pipeline.CaptureSink{}
	stages := []pipeline.Stage{
		pipeline.Filter("no-beta", pipeline.Skip, func(r pipeline.Record) (bool, error) {
			return string(r.Value) != "beta", nil
		}),
		pipeline.Map("upper", pipeline.Fail, func(r pipeline.Record) (pipeline.Record, error) {
			r.Value = bytes.ToUpper(r.Value)
			return r, nil
		}),
	}
	rt, err := pipeline.Build(pipeline.Config{Name: "words", CommitInterval: time.Hour}, src, stages,
		[]pipeline.SinkSpec{{Name: "capture", Sink: sink, Options: pipeline.SinkOptions{Linger: time.Millisecond}}},
		pipeline.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		panic(err)
	}
	report, err := rt.Run(context.Background())
	fmt.Println(report.State, err, report.FinalWatermarks)
	for _, r := range sink.Records() {
		fmt.Println(string(r.Value))
	}
	// Output:
	// commit partition 0 at 4
	// completed <nil> [{0 4}]
	// ALPHA
	// GAMMA
	// DELTA
}
