package nats_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/natsservers"
	spatenats "github.com/spate-go/spate/stores/nats"
)

// TestStreamNotFoundIsWaitedOut: a loaded R3 cluster once answered
// "stream not found" for a stream a test had just written to. The driver
// sends a read again while that answer lasts (until it has lasted a few
// seconds): here the bucket's stream is deleted and made again 300 ms
// later, and a Get and a List issued in the gap return the new, empty
// stream's answer, not an error.
func TestStreamNotFoundIsWaitedOut(t *testing.T) {
	srv := natsservers.Start(t)
	nc := srv.Connect(t)
	job := natsservers.NewJob()
	s := open(t, nc, spatenats.Options{Job: job, TTL: 2 * time.Second})
	ctx := testCtx(t, 20*time.Second)
	mustCreate(t, ctx, s, spate.Durable, "gone.k")

	js, streams := jobStreams(t, nc, job)
	st, err := js.Stream(ctx, streams[0])
	require.NoError(t, err)
	cfg := st.CachedInfo().Config
	require.NoError(t, js.DeleteStream(ctx, cfg.Name))
	// Proof the gap is real: the server says the stream does not exist.
	_, err = js.Stream(ctx, cfg.Name)
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)

	recreated := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		_, err := js.CreateStream(ctx, cfg)
		recreated <- err
	}()
	start := time.Now()
	_, ok, err := s.Get(ctx, spate.Durable, "gone.k")
	waited := time.Since(start)
	require.NoError(t, err, "a Get in the gap waits the stream-not-found answer out")
	require.False(t, ok, "the re-made stream is empty")
	require.NoError(t, <-recreated)
	assert.GreaterOrEqual(t, waited, 250*time.Millisecond, "the Get answered before the stream was made again")
	entries, err := s.List(ctx, spate.Durable, "gone.")
	require.NoError(t, err)
	require.Empty(t, entries)
}

// TestDeletedBucketIsFatal: a bucket deleted under an open store makes
// reads fail Fatal once the server has said for a few seconds that its
// stream does not exist, with an error that names the bucket and says it
// was deleted; a watch on it then fails the same way at once. A call whose
// deadline ends first is Retryable, and its answers count towards the
// few seconds: an op timeout shorter than them does not hide a deletion.
func TestDeletedBucketIsFatal(t *testing.T) {
	t.Parallel()
	srv := natsservers.Start(t)
	nc := srv.Connect(t)
	job := natsservers.NewJob()
	s := open(t, nc, spatenats.Options{Job: job, TTL: 2 * time.Second})
	ctx := testCtx(t, 30*time.Second)
	mustCreate(t, ctx, s, spate.Ephemeral, "gone.k")

	js, streams := jobStreams(t, nc, job)
	require.NoError(t, js.DeleteStream(ctx, streams[1]))
	_, ename := spatenats.Buckets(job)

	// Calls shorter than the wait end Retryable: the server's answer is
	// not yet final.
	start := time.Now()
	for range 3 {
		short := testCtx(t, 200*time.Millisecond)
		_, err := s.List(short, spate.Ephemeral, "gone.")
		require.ErrorIs(t, err, spate.ErrRetryable)
		require.False(t, errors.Is(err, spate.ErrFatal), "got %v", err)
	}

	_, _, err := s.Get(ctx, spate.Ephemeral, "gone.k")
	waited := time.Since(start)
	require.Error(t, err)
	require.ErrorIs(t, err, spate.ErrFatal)
	require.NotErrorIs(t, err, spate.ErrRetryable)
	require.ErrorContains(t, err, ename)
	require.ErrorContains(t, err, "deleted")
	assert.GreaterOrEqual(t, waited, 4*time.Second, "the answer was taken as final before it had persisted")
	assert.Less(t, waited, 10*time.Second, "the short calls' answers did not count towards the wait")

	start = time.Now()
	_, err = s.Watch(ctx, spate.Ephemeral, "gone.")
	require.ErrorIs(t, err, spate.ErrFatal)
	require.ErrorContains(t, err, "deleted")
	assert.Less(t, time.Since(start), time.Second, "once believed, the deletion is reported at once")
}
