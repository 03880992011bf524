package nats

import (
	"context"
	"log/slog"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
)

// fakeMsg is one consumer message: a key's subject, a value and its stream
// sequence.
type fakeMsg struct {
	subject string
	data    []byte
	seq     uint64
	pending uint64
}

func (m *fakeMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: m.seq}, NumPending: m.pending}, nil
}
func (m *fakeMsg) Data() []byte                     { return m.data }
func (m *fakeMsg) Headers() natsgo.Header           { return nil }
func (m *fakeMsg) Subject() string                  { return m.subject }
func (m *fakeMsg) Reply() string                    { return "" }
func (m *fakeMsg) Ack() error                       { return nil }
func (m *fakeMsg) DoubleAck(context.Context) error  { return nil }
func (m *fakeMsg) Nak() error                       { return nil }
func (m *fakeMsg) NakWithDelay(time.Duration) error { return nil }
func (m *fakeMsg) InProgress() error                { return nil }
func (m *fakeMsg) Term() error                      { return nil }
func (m *fakeMsg) TermWithReason(string) error      { return nil }
func (m *fakeMsg) String() string                   { return m.subject }

var _ jetstream.Msg = (*fakeMsg)(nil)

// fakeMessages hands out its messages in order, then blocks until stopped.
type fakeMessages struct {
	msgs    chan jetstream.Msg
	stopped chan struct{}
}

func (f *fakeMessages) Next(opts ...jetstream.NextOpt) (jetstream.Msg, error) {
	select {
	case m := <-f.msgs:
		return m, nil
	case <-f.stopped:
		return nil, jetstream.ErrMsgIteratorClosed
	}
}
func (f *fakeMessages) Stop()  { close(f.stopped) }
func (f *fakeMessages) Drain() {}

// TestWatchDropsRedeliveredMessages: a consumer re-made after a reset may
// start before the last message it delivered. The watch sends each change
// once: here the snapshot's message (k at 2) is delivered again after the
// snapshot, then a write before it (j at 1) and the live change (k at 3);
// only k at 3 comes out as a live event.
func TestWatchDropsRedeliveredMessages(t *testing.T) {
	b := &bucket{ks: spate.Durable, name: "b", pre: "$KV.b."}
	s := &store{log: slog.New(slog.DiscardHandler)}
	keys := []string{"j", "k"}
	f := &fakeMessages{msgs: make(chan jetstream.Msg, 8), stopped: make(chan struct{})}
	msg := func(key string, seq, pending uint64) *fakeMsg {
		return &fakeMsg{subject: b.pre + key, data: []byte(key), seq: seq, pending: pending}
	}
	// The snapshot: j at 1, k at 2, nothing pending after k.
	f.msgs <- msg("j", 1, 1)
	f.msgs <- msg("k", 2, 0)
	// Delivered again after a reset, then the live write.
	f.msgs <- msg("j", 1, 1)
	f.msgs <- msg("k", 2, 1)
	f.msgs <- msg("k", 3, 0)
	w := &watch{
		s: s, b: b, keys: keys, it: f, pending: 2,
		spec: watchSpec{op: "watch-keys", label: "j", match: func(k string) bool {
			return k == "j" || k == "k"
		}},
		out:    make(chan spate.WatchEvent),
		signal: make(chan struct{}, 1),
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		go w.pump(ctx)
		w.run(ctx)
	}()
	next := func() spate.WatchEvent {
		select {
		case ev := <-w.out:
			return ev
		case <-time.After(3 * WatchStallBound):
			t.Fatalf("no watch event within %v", 3*WatchStallBound)
			return spate.WatchEvent{}
		}
	}
	var snap []uint64
	for ev := next(); ev.Kind != spate.WatchSnapshotDone; ev = next() {
		require.Equal(t, spate.WatchPut, ev.Kind, "snapshot event %+v", ev)
		snap = append(snap, ev.Revision)
	}
	require.Equal(t, []uint64{1, 2}, snap, "the snapshot")
	ev := next()
	require.Equal(t, spate.WatchPut, ev.Kind)
	require.Equal(t, "k", ev.Key)
	require.Equal(t, uint64(3), ev.Revision, "the first live event is the new write, not a message delivered again")
	select {
	case ev := <-w.out:
		t.Fatalf("an extra event: %+v", ev)
	case <-time.After(200 * time.Millisecond):
	}
	cancel()
	f.Stop()
	<-done
}
