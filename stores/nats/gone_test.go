package nats_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/faultproxy"
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
	// Not parallel: the stream is made again 300 ms into the driver's
	// wait of a few seconds; a loaded machine must not stretch the gap
	// past that wait.
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

	// Calls shorter than the wait end Retryable while the server's answer
	// is not yet final; their answers count towards the wait, so one of
	// them, as short as the first, ends Fatal once the wait is over.
	start := time.Now()
	var err error
	for calls := 1; ; calls++ {
		short := testCtx(t, 200*time.Millisecond)
		_, err = s.List(short, spate.Ephemeral, "gone.")
		if errors.Is(err, spate.ErrFatal) {
			t.Logf("call %d, %v after the first, was told the bucket is gone", calls, time.Since(start).Round(time.Millisecond))
			break
		}
		require.ErrorIs(t, err, spate.ErrRetryable, "call %d", calls)
		require.NoError(t, ctx.Err(), "no call as short as 200ms was ever told the bucket is gone: the short calls' answers did not count towards the wait")
	}
	waited := time.Since(start)
	require.NotErrorIs(t, err, spate.ErrRetryable)
	require.ErrorContains(t, err, ename)
	require.ErrorContains(t, err, "deleted")
	assert.GreaterOrEqual(t, waited, 4*time.Second, "the answer was taken as final before it had persisted")

	_, _, err = s.Get(ctx, spate.Ephemeral, "gone.k")
	require.ErrorIs(t, err, spate.ErrFatal)
	require.ErrorContains(t, err, "deleted")

	// Once believed, the deletion is reported at once: a watch bounded
	// well under the wait gets it (were it waited out again, the bound
	// would end the call Retryable).
	_, err = s.Watch(testCtx(t, 2*time.Second), spate.Ephemeral, "gone.")
	require.ErrorIs(t, err, spate.ErrFatal)
	require.NotErrorIs(t, err, spate.ErrRetryable)
	require.ErrorContains(t, err, "deleted")
}

// TestDeletionIsBelievedThoughCallsEndMidRequest: a call whose deadline
// ends while its request is in flight got no answer, and no answer says
// nothing about the stream. Here every request takes at least 300 ms (a
// proxy's latency) and calls of 1 s, which get answers, alternate with
// calls of 100 ms, which never do: the deletion is still believed once
// the answers have said so for the driver's wait. (A cut request once
// counted as the stream being there again and restarted the wait, so on
// a loaded machine, where a short call's request is often cut, a deleted
// bucket stayed Retryable for good: TestDeletedBucketIsFatal failed with
// no Fatal in 30 s.)
func TestDeletionIsBelievedThoughCallsEndMidRequest(t *testing.T) {
	t.Parallel()
	srv := natsservers.Start(t)
	proxy := faultproxy.New(t, strings.TrimPrefix(srv.URL, "nats://"))
	nc, err := natsgo.Connect("nats://" + proxy.Addr())
	require.NoError(t, err, "connect through the proxy")
	t.Cleanup(nc.Close)
	job := natsservers.NewJob()
	s := open(t, nc, spatenats.Options{Job: job, TTL: 2 * time.Second})
	ctx := testCtx(t, 40*time.Second)
	mustCreate(t, ctx, s, spate.Ephemeral, "gone.k")

	direct := srv.Connect(t)
	js, streams := jobStreams(t, direct, job)
	require.NoError(t, js.DeleteStream(ctx, streams[1]))
	_, ename := spatenats.Buckets(job)
	proxy.SetLatency(150 * time.Millisecond) // each way: 300 ms a request

	start := time.Now()
	for calls := 1; ; calls++ {
		d := time.Second
		if calls%2 == 0 {
			d = 100 * time.Millisecond // ends mid-request: no answer
		}
		_, err = s.List(testCtx(t, d), spate.Ephemeral, "gone.")
		if errors.Is(err, spate.ErrFatal) {
			t.Logf("call %d, %v after the first, was told the bucket is gone", calls, time.Since(start).Round(time.Millisecond))
			break
		}
		require.ErrorIs(t, err, spate.ErrRetryable, "call %d", calls)
		require.NoError(t, ctx.Err(), "no call was told the bucket is gone in %v: the calls cut mid-request restarted the wait", time.Since(start).Round(time.Second))
	}
	require.NotErrorIs(t, err, spate.ErrRetryable)
	require.ErrorContains(t, err, ename)
	require.ErrorContains(t, err, "deleted")
}
