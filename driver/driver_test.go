package driver_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/driver"
)

// countingDriver is a driver.Driver that counts its calls, records any that
// arrive after its Close began, and can hold calls until released.
type countingDriver struct {
	calls  atomic.Int64 // the six primitives
	late   atomic.Int64 // primitives that arrived after Close began
	closes atomic.Int64
	closed atomic.Bool

	// block, when set, makes every primitive wait for it or ctx.
	block chan struct{}
	// entered receives one value per blocked call that entered.
	entered chan struct{}
	// err, when set, is what every primitive returns.
	err error

	mu      sync.Mutex
	returns []string // "call" when a primitive returned, "close" at Close
	watches []chan spate.WatchEvent
}

func (d *countingDriver) Capabilities() spate.Capabilities {
	return spate.Capabilities{Driver: "fake", TTL: time.Second, MaxValueSize: 8}
}

func (d *countingDriver) call(ctx context.Context) error {
	d.calls.Add(1)
	if d.closed.Load() {
		d.late.Add(1)
	}
	defer func() {
		d.mu.Lock()
		d.returns = append(d.returns, "call")
		d.mu.Unlock()
	}()
	if d.block != nil {
		if d.entered != nil {
			d.entered <- struct{}{}
		}
		select {
		case <-d.block:
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", context.Cause(ctx), spate.ErrRetryable)
		}
	}
	return d.err
}

func (d *countingDriver) Create(ctx context.Context, _ spate.Keyspace, _ string, _ []byte) (spate.Outcome, error) {
	if err := d.call(ctx); err != nil {
		return spate.Outcome{}, err
	}
	return spate.Won(1), nil
}

func (d *countingDriver) Update(ctx context.Context, _ spate.Keyspace, _ string, _ []byte, exp uint64) (spate.Outcome, error) {
	if err := d.call(ctx); err != nil {
		return spate.Outcome{}, err
	}
	return spate.Won(exp + 1), nil
}

func (d *countingDriver) Get(ctx context.Context, _ spate.Keyspace, key string) (spate.Entry, bool, error) {
	if err := d.call(ctx); err != nil {
		return spate.Entry{}, false, err
	}
	return spate.Entry{Key: key, Value: []byte{}, Revision: 1}, true, nil
}

func (d *countingDriver) Delete(ctx context.Context, _ spate.Keyspace, _ string, _ uint64) (spate.Outcome, error) {
	if err := d.call(ctx); err != nil {
		return spate.Outcome{}, err
	}
	return spate.Won(2), nil
}

func (d *countingDriver) List(ctx context.Context, _ spate.Keyspace, _ string) ([]spate.Entry, error) {
	if err := d.call(ctx); err != nil {
		return nil, err
	}
	return nil, nil
}

// Watch sends SnapshotDone, then whatever the test puts on the channel it
// keeps in d.watches, until ctx ends or the driver closes.
func (d *countingDriver) Watch(ctx context.Context, _ spate.Keyspace, _ string) (<-chan spate.WatchEvent, error) {
	if err := d.call(ctx); err != nil {
		return nil, err
	}
	in := make(chan spate.WatchEvent)
	out := make(chan spate.WatchEvent)
	d.mu.Lock()
	d.watches = append(d.watches, in)
	d.mu.Unlock()
	go func() {
		defer close(out)
		queue := []spate.WatchEvent{{Kind: spate.WatchSnapshotDone}}
		for {
			var send chan<- spate.WatchEvent
			var next spate.WatchEvent
			if len(queue) > 0 {
				send, next = out, queue[0]
			}
			select {
			case <-ctx.Done():
				return
			case ev := <-in:
				queue = append(queue, ev)
			case send <- next:
				queue = queue[1:]
				if next.Kind == spate.WatchError {
					return
				}
			}
		}
	}()
	return out, nil
}

func (d *countingDriver) Close() error {
	d.closed.Store(true)
	d.closes.Add(1)
	d.mu.Lock()
	d.returns = append(d.returns, "close")
	d.mu.Unlock()
	return nil
}

// allCalls runs each of the six primitives once with the given arguments and
// returns their errors by name.
func allCalls(ctx context.Context, s spate.Store, ks spate.Keyspace, key string, value []byte) map[string]error {
	errs := map[string]error{}
	_, errs["create"] = s.Create(ctx, ks, key, value)
	_, errs["update"] = s.Update(ctx, ks, key, value, 7)
	_, _, errs["get"] = s.Get(ctx, ks, key)
	_, errs["delete"] = s.Delete(ctx, ks, key, spate.AnyRevision)
	_, errs["list"] = s.List(ctx, ks, key)
	wctx, cancel := context.WithCancel(ctx)
	ch, err := s.Watch(wctx, ks, key)
	cancel()
	errs["watch"] = err
	if ch != nil {
		for range ch {
		}
	}
	return errs
}

func TestPortableRejectsBadInputWithoutCallingTheDriver(t *testing.T) {
	d := &countingDriver{}
	s := driver.NewStore(d)
	ctx := t.Context()

	for _, ks := range []spate.Keyspace{0, 3, 255} {
		for op, err := range allCalls(ctx, s, ks, "plan", nil) {
			require.Error(t, err, "%s on keyspace %v", op, ks)
			assert.True(t, spate.IsFatal(err), "%s on keyspace %v: %v", op, ks, err)
			assert.NotErrorIs(t, err, spate.ErrClosed, "%s on keyspace %v", op, ks)
			assert.True(t, strings.HasPrefix(err.Error(), fmt.Sprintf(`fake: %s %v "plan": invalid keyspace`, op, ks)),
				"%s: the error names driver, op, keyspace and key: %v", op, err)
		}
	}
	// Keys every primitive refuses (prefixes too: they are longer than a
	// key may be, or start with '.').
	for _, key := range []string{".a", "a..b", "a b", "a/b", strings.Repeat("k", spate.KeyMaxLen+1)} {
		for op, err := range allCalls(ctx, s, spate.Durable, key, nil) {
			assert.ErrorIs(t, err, spate.ErrInvalidKey, "%s %q", op, key)
			assert.True(t, spate.IsFatal(err), "%s %q: %v", op, key, err)
			assert.True(t, strings.HasPrefix(err.Error(), fmt.Sprintf("fake: %s durable %q: ", op, key)),
				"%s: the error names driver, op, keyspace and key: %v", op, err)
		}
	}
	// A trailing dot and the empty string are prefixes, not keys.
	for _, key := range []string{"split.", ""} {
		_, err := s.Create(ctx, spate.Ephemeral, key, nil)
		assert.ErrorIs(t, err, spate.ErrInvalidKey, "create %q", key)
		_, err = s.Update(ctx, spate.Ephemeral, key, nil, 3)
		assert.ErrorIs(t, err, spate.ErrInvalidKey, "update %q", key)
		_, _, err = s.Get(ctx, spate.Ephemeral, key)
		assert.ErrorIs(t, err, spate.ErrInvalidKey, "get %q", key)
		_, err = s.Delete(ctx, spate.Ephemeral, key, 3)
		assert.ErrorIs(t, err, spate.ErrInvalidKey, "delete %q", key)
	}
	// Over the cap of 8 bytes.
	_, err := s.Create(ctx, spate.Durable, "plan", []byte("123456789"))
	assert.ErrorIs(t, err, spate.ErrValueTooLarge)
	assert.True(t, spate.IsFatal(err), "%v", err)
	assert.True(t, strings.HasPrefix(err.Error(), `fake: create durable "plan": value of 9 bytes`), "%v", err)
	_, err = s.Update(ctx, spate.Ephemeral, "plan", []byte("123456789"), 4)
	assert.ErrorIs(t, err, spate.ErrValueTooLarge)
	assert.True(t, spate.IsFatal(err), "%v", err)
	// A dead context is Retryable and keeps its cause.
	dead, cancel := context.WithCancel(ctx)
	cancel()
	for op, err := range allCalls(dead, s, spate.Durable, "plan", nil) {
		assert.ErrorIs(t, err, context.Canceled, op)
		assert.True(t, spate.IsRetryable(err), "%s: %v", op, err)
	}
	// No live key is at revision 0: Update loses without asking.
	o, err := s.Update(ctx, spate.Durable, "plan", []byte("v"), 0)
	require.NoError(t, err)
	assert.Equal(t, spate.Outcome{}, o, "Update at revision 0 is Lost")

	assert.Zero(t, d.calls.Load(), "no bad call reached the driver")

	// The valid calls do reach it, each once, values up to the cap too.
	for op, err := range allCalls(ctx, s, spate.Durable, "plan", []byte("12345678")) {
		require.NoError(t, err, op)
	}
	for op, err := range allCalls(ctx, s, spate.Ephemeral, "", nil) {
		if op == "list" || op == "watch" {
			require.NoError(t, err, "the empty prefix is valid for %s", op)
		}
	}
	assert.Equal(t, int64(6+2), d.calls.Load(), "each valid call reached the driver once")
	require.NoError(t, s.Close())
}

func TestPortableFormatsAndClassifiesDriverErrors(t *testing.T) {
	ctx := t.Context()
	for _, tc := range []struct {
		name  string
		err   error
		fatal bool
	}{
		{"classified retryable", fmt.Errorf("reply lost: %w", spate.ErrRetryable), false},
		{"classified fatal", fmt.Errorf("denied: %w", spate.ErrFatal), true},
		{"unclassified", errors.New("mystery"), true},
		{"bare context error", context.DeadlineExceeded, false},
	} {
		d := &countingDriver{err: tc.err}
		s := driver.NewStore(d)
		for op, err := range allCalls(ctx, s, spate.Ephemeral, "split.a", []byte("v")) {
			require.Error(t, err, "%s: %s", tc.name, op)
			assert.ErrorIs(t, err, tc.err, "%s: %s keeps the driver's error", tc.name, op)
			assert.Equal(t, tc.fatal, spate.IsFatal(err), "%s: %s: %v", tc.name, op, err)
			assert.Equal(t, !tc.fatal, spate.IsRetryable(err), "%s: %s: %v", tc.name, op, err)
			assert.True(t, strings.HasPrefix(err.Error(), fmt.Sprintf("fake: %s ephemeral %q: %s", op, "split.a", tc.err.Error())),
				"%s: %s: one prefix, then the driver's message: %v", tc.name, op, err)
		}
		require.NoError(t, s.Close())
	}
}

func TestPortableNoDriverCallAfterClose(t *testing.T) {
	d := &countingDriver{}
	s := driver.NewStore(d)
	ctx := t.Context()
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close is idempotent")
	for op, err := range allCalls(ctx, s, spate.Durable, "plan", []byte("v")) {
		assert.ErrorIs(t, err, spate.ErrClosed, op)
		assert.True(t, spate.IsFatal(err), "%s: %v", op, err)
		assert.True(t, strings.HasPrefix(err.Error(), fmt.Sprintf(`fake: %s durable "plan": store is closed`, op)), "%s: %v", op, err)
	}
	// After Close even bad arguments report the closed store.
	_, _, err := s.Get(ctx, spate.Keyspace(9), "a..b")
	assert.ErrorIs(t, err, spate.ErrClosed)
	_, err = s.Update(ctx, spate.Durable, "plan", nil, 0)
	assert.ErrorIs(t, err, spate.ErrClosed, "even Update at revision 0")
	ran := false
	err = s.Do("connect", func() error { ran = true; return nil })
	assert.ErrorIs(t, err, spate.ErrClosed)
	assert.False(t, ran, "Do runs nothing after Close")
	assert.Equal(t, "fake", s.Capabilities().Driver, "Capabilities still answers, without the driver")

	assert.Zero(t, d.calls.Load(), "no call reached the driver")
	assert.Equal(t, int64(1), d.closes.Load(), "the driver was closed once")
}

// TestPortableCloseCancelsAndWaitsForCallsInFlight: a call blocked in the
// driver when Close begins has its context cancelled with ErrClosed as the
// cause, and the driver's Close comes only after it returned.
func TestPortableCloseCancelsAndWaitsForCallsInFlight(t *testing.T) {
	d := &countingDriver{block: make(chan struct{}), entered: make(chan struct{}, 1)}
	s := driver.NewStore(d)
	done := make(chan error, 1)
	go func() {
		_, _, err := s.Get(context.Background(), spate.Durable, "plan")
		done <- err
	}()
	<-d.entered
	require.NoError(t, s.Close())
	err := <-done
	assert.True(t, spate.IsRetryable(err), "a call cut short by Close may have landed: Retryable, %v", err)
	assert.ErrorIs(t, err, spate.ErrClosed, "the cause says why")
	d.mu.Lock()
	assert.Equal(t, []string{"call", "close"}, d.returns, "the driver closed after the call returned")
	d.mu.Unlock()
	assert.Zero(t, d.late.Load())
}

// TestPortableCloseRacingCalls hammers every primitive from several
// goroutines while Close runs (twice, concurrently): no call reaches the
// driver after its Close began, every call either succeeds or reports the
// closed store, and the driver is closed once. Run with -race.
func TestPortableCloseRacingCalls(t *testing.T) {
	for round := range 50 {
		d := &countingDriver{}
		s := driver.NewStore(d)
		ctx := t.Context()
		var wg sync.WaitGroup
		start := make(chan struct{})
		var after atomic.Int64
		for range 6 {
			wg.Go(func() {
				<-start
				for i := 0; ; i++ {
					for op, err := range allCalls(ctx, s, spate.Durable, "plan", []byte("v")) {
						if err != nil {
							if !assert.ErrorIs(t, err, spate.ErrClosed, "round %d: %s", round, op) {
								return
							}
							after.Add(1)
						}
					}
					if after.Load() > 0 && i > 2 {
						return
					}
				}
			})
		}
		close(start)
		time.Sleep(time.Duration(round%5) * 100 * time.Microsecond)
		var closers sync.WaitGroup
		for range 2 {
			closers.Go(func() { assert.NoError(t, s.Close()) })
		}
		closers.Wait()
		wg.Wait()
		require.Zero(t, d.late.Load(), "round %d: a call reached the driver after its Close began", round)
		require.Equal(t, int64(1), d.closes.Load(), "round %d: the driver is closed once", round)
	}
}

func TestPortableWatch(t *testing.T) {
	t.Run("Close ends the stream", func(t *testing.T) {
		d := &countingDriver{}
		s := driver.NewStore(d)
		ch, err := s.Watch(t.Context(), spate.Durable, "split.")
		require.NoError(t, err)
		ev := <-ch
		assert.Equal(t, spate.WatchSnapshotDone, ev.Kind)
		require.NoError(t, s.Close())
		for range ch {
		}
		assert.Zero(t, d.late.Load())
	})
	t.Run("the consumer's ctx ends the stream", func(t *testing.T) {
		d := &countingDriver{}
		s := driver.NewStore(d)
		ctx, cancel := context.WithCancel(t.Context())
		ch, err := s.Watch(ctx, spate.Durable, "split.")
		require.NoError(t, err)
		cancel()
		for range ch { // closes, whether or not SnapshotDone got through
		}
		require.NoError(t, s.Close())
	})
	t.Run("events pass straight through", func(t *testing.T) {
		d := &countingDriver{}
		s := driver.NewStore(d)
		ch, err := s.Watch(t.Context(), spate.Durable, "split.")
		require.NoError(t, err)
		d.mu.Lock()
		in := d.watches[0]
		d.mu.Unlock()
		cause := fmt.Errorf("stream broke: %w", spate.ErrRetryable)
		in <- spate.WatchEvent{Kind: spate.WatchPut, Key: "split.a", Value: []byte("v"), Revision: 3}
		in <- spate.WatchEvent{Kind: spate.WatchError, Err: cause}
		var got []spate.WatchEvent
		for ev := range ch {
			got = append(got, ev)
		}
		require.Len(t, got, 3)
		assert.Equal(t, spate.WatchSnapshotDone, got[0].Kind)
		assert.Equal(t, spate.WatchEvent{Kind: spate.WatchPut, Key: "split.a", Value: []byte("v"), Revision: 3}, got[1])
		assert.Equal(t, spate.WatchEvent{Kind: spate.WatchError, Err: cause}, got[2])
		require.NoError(t, s.Close())
	})
}

// releasingDriver is a countingDriver with the Releaser capability; it
// records the arguments of the last UpdateAndDelete.
type releasingDriver struct {
	countingDriver
	args []any
}

func (d *releasingDriver) UpdateAndDelete(ctx context.Context, dk string, v []byte, exp uint64, ek string, lexp uint64) (spate.Outcome, spate.Outcome, error) {
	if err := d.call(ctx); err != nil {
		return spate.Outcome{}, spate.Outcome{}, err
	}
	d.args = []any{dk, string(v), exp, ek, lexp}
	return spate.Won(exp + 1), spate.Won(exp + 2), nil
}

func TestPortableUpdateAndDelete(t *testing.T) {
	ctx := t.Context()

	// Without the capability: not reported, and the call is Fatal.
	plain := driver.NewStore(&countingDriver{})
	assert.False(t, plain.Capabilities().UpdateAndDelete)
	_, ok := spate.ReleaserOf(plain)
	assert.False(t, ok, "ReleaserOf needs the capability reported, not only the method")
	_, _, err := plain.UpdateAndDelete(ctx, "split.a", nil, 3, "split.a", 4)
	require.Error(t, err)
	assert.True(t, spate.IsFatal(err), "%v", err)
	assert.True(t, strings.HasPrefix(err.Error(), `fake: update-and-delete durable "split.a": `), "%v", err)
	require.NoError(t, plain.Close())

	d := &releasingDriver{}
	s := driver.NewStore(d)
	assert.True(t, s.Capabilities().UpdateAndDelete, "NewStore reports the driver's capability")
	r, ok := spate.ReleaserOf(s)
	require.True(t, ok)

	u, del, err := r.UpdateAndDelete(ctx, "split.a", []byte("v"), 3, "split.a", 7)
	require.NoError(t, err)
	assert.Equal(t, spate.Won(4), u)
	assert.Equal(t, spate.Won(5), del)
	assert.Equal(t, []any{"split.a", "v", uint64(3), "split.a", uint64(7)}, d.args)

	// The layer's rules: revision 0 loses both; a leaseExpected of 0 is a
	// plain Update; bad arguments never reach the driver.
	n := d.calls.Load()
	u, del, err = r.UpdateAndDelete(ctx, "split.a", nil, 0, "split.a", 7)
	require.NoError(t, err)
	assert.False(t, u.Won || del.Won)
	assert.Equal(t, n, d.calls.Load(), "expected 0 reaches no driver")
	d.args = nil
	u, del, err = r.UpdateAndDelete(ctx, "split.a", nil, 3, "split.a", spate.AnyRevision)
	require.NoError(t, err)
	assert.Equal(t, spate.Won(4), u, "a plain Update")
	assert.False(t, del.Won)
	assert.Nil(t, d.args, "leaseExpected 0 never reaches the driver's UpdateAndDelete")
	n = d.calls.Load()
	for _, tc := range []struct {
		dk, ek string
		v      []byte
		is     error
		prefix string
	}{
		{"a..b", "split.a", nil, spate.ErrInvalidKey, `fake: update-and-delete durable "a..b": `},
		{"split.a", "a..b", nil, spate.ErrInvalidKey, `fake: update-and-delete ephemeral "a..b": `},
		{"split.a", "split.a", make([]byte, 9), spate.ErrValueTooLarge, `fake: update-and-delete durable "split.a": `},
	} {
		_, _, err := r.UpdateAndDelete(ctx, tc.dk, tc.v, 3, tc.ek, 4)
		assert.ErrorIs(t, err, tc.is)
		assert.True(t, spate.IsFatal(err))
		assert.True(t, strings.HasPrefix(err.Error(), tc.prefix), "%v", err)
	}
	assert.Equal(t, n, d.calls.Load(), "bad arguments reach no driver")

	d.err = errors.New("mystery")
	_, _, err = r.UpdateAndDelete(ctx, "split.a", nil, 3, "split.a", 4)
	assert.ErrorIs(t, err, d.err)
	assert.True(t, spate.IsFatal(err), "an unclassified error gets a class")
	d.err = nil

	require.NoError(t, s.Close())
	_, _, err = r.UpdateAndDelete(ctx, "a..b", nil, 3, "split.a", 4)
	assert.ErrorIs(t, err, spate.ErrClosed, "the closed store comes first")
	assert.True(t, spate.IsFatal(err))
}

// sessionDriver is a countingDriver with the Sessioner capability; its
// sessions count their calls through the driver and record their Close in
// d.returns, so the order of session and driver Close shows.
type sessionDriver struct {
	countingDriver
	expire   atomic.Bool // KeepAlive reports the session expired
	sessions []*fakeSession
}

func (d *sessionDriver) NewSession(ctx context.Context) (spate.Session, error) {
	if err := d.call(ctx); err != nil {
		return nil, err
	}
	fs := &fakeSession{d: d}
	d.mu.Lock()
	d.sessions = append(d.sessions, fs)
	d.mu.Unlock()
	return fs, nil
}

type fakeSession struct {
	d      *sessionDriver
	closes atomic.Int64
	late   atomic.Int64 // calls after its Close
}

func (s *fakeSession) enter(ctx context.Context) error {
	if s.closes.Load() > 0 {
		s.late.Add(1)
	}
	return s.d.call(ctx)
}

func (s *fakeSession) Create(ctx context.Context, _ string, _ []byte) (spate.Outcome, error) {
	if err := s.enter(ctx); err != nil {
		return spate.Outcome{}, err
	}
	return spate.Won(1), nil
}

func (s *fakeSession) Update(ctx context.Context, _ string, _ []byte, exp uint64) (spate.Outcome, error) {
	if err := s.enter(ctx); err != nil {
		return spate.Outcome{}, err
	}
	return spate.Won(exp + 1), nil
}

func (s *fakeSession) KeepAlive(ctx context.Context) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	if s.d.expire.Load() {
		return fmt.Errorf("gone: %w: %w", spate.ErrSessionExpired, spate.ErrFatal)
	}
	return nil
}

func (s *fakeSession) Close() error {
	s.closes.Add(1)
	s.d.mu.Lock()
	s.d.returns = append(s.d.returns, "session-close")
	s.d.mu.Unlock()
	return nil
}

func TestPortableSessionCapability(t *testing.T) {
	ctx := t.Context()
	plain := driver.NewStore(&countingDriver{})
	assert.False(t, plain.Capabilities().Sessions)
	_, ok := spate.SessionerOf(plain)
	assert.False(t, ok, "SessionerOf needs the capability reported")
	_, err := plain.NewSession(ctx)
	require.Error(t, err)
	assert.True(t, spate.IsFatal(err), "%v", err)
	assert.True(t, strings.HasPrefix(err.Error(), `fake: session-new ephemeral "": `), "%v", err)
	require.NoError(t, plain.Close())

	s := driver.NewStore(&sessionDriver{})
	assert.True(t, s.Capabilities().Sessions, "NewStore reports the driver's capability")
	_, ok = spate.SessionerOf(s)
	assert.True(t, ok)
	require.NoError(t, s.Close())
}

func TestPortableSessionChecks(t *testing.T) {
	ctx := t.Context()
	d := &sessionDriver{}
	s := driver.NewStore(d)
	sess, err := s.NewSession(ctx)
	require.NoError(t, err)

	o, err := sess.Create(ctx, "split.a", []byte("v"))
	require.NoError(t, err)
	assert.Equal(t, spate.Won(1), o)
	o, err = sess.Update(ctx, "split.a", []byte("v"), 4)
	require.NoError(t, err)
	assert.Equal(t, spate.Won(5), o)
	require.NoError(t, sess.KeepAlive(ctx))

	n := d.calls.Load()
	o, err = sess.Update(ctx, "split.a", nil, 0)
	require.NoError(t, err)
	assert.False(t, o.Won, "expected revision 0 loses")
	for _, tc := range []struct {
		name   string
		err    error
		is     error
		prefix string
	}{
		{"create invalid key", func() error { _, err := sess.Create(ctx, "a..b", nil); return err }(), spate.ErrInvalidKey, `fake: session-create ephemeral "a..b": `},
		{"update invalid key", func() error { _, err := sess.Update(ctx, "", nil, 3); return err }(), spate.ErrInvalidKey, `fake: session-update ephemeral "": `},
		{"create too large", func() error { _, err := sess.Create(ctx, "split.a", make([]byte, 9)); return err }(), spate.ErrValueTooLarge, `fake: session-create ephemeral "split.a": `},
		{"update too large", func() error { _, err := sess.Update(ctx, "split.a", make([]byte, 9), 3); return err }(), spate.ErrValueTooLarge, `fake: session-update ephemeral "split.a": `},
	} {
		require.Error(t, tc.err, tc.name)
		assert.ErrorIs(t, tc.err, tc.is, tc.name)
		assert.True(t, spate.IsFatal(tc.err), tc.name)
		assert.True(t, strings.HasPrefix(tc.err.Error(), tc.prefix), "%s: %v", tc.name, tc.err)
	}
	dead, cancel := context.WithCancel(ctx)
	cancel()
	_, err = sess.Create(dead, "split.a", nil)
	assert.True(t, spate.IsRetryable(err), "%v", err)
	_, err = sess.Update(dead, "split.a", nil, 3)
	assert.True(t, spate.IsRetryable(err), "%v", err)
	err = sess.KeepAlive(dead)
	assert.True(t, spate.IsRetryable(err), "%v", err)
	assert.True(t, strings.HasPrefix(err.Error(), `fake: keep-alive ephemeral "": `), "%v", err)
	_, err = s.NewSession(dead)
	assert.True(t, spate.IsRetryable(err), "%v", err)
	assert.Equal(t, n, d.calls.Load(), "bad arguments and dead contexts reach no driver")

	d.err = errors.New("mystery")
	err = sess.KeepAlive(ctx)
	assert.ErrorIs(t, err, d.err)
	assert.True(t, spate.IsFatal(err), "an unclassified error gets a class")
	d.err = nil

	// An expired session: every later call fails the same way, without the
	// driver.
	d.expire.Store(true)
	err = sess.KeepAlive(ctx)
	assert.ErrorIs(t, err, spate.ErrSessionExpired)
	assert.True(t, spate.IsFatal(err))
	n = d.calls.Load()
	_, err = sess.Create(ctx, "split.b", nil)
	assert.ErrorIs(t, err, spate.ErrSessionExpired)
	assert.True(t, spate.IsFatal(err))
	assert.Equal(t, n, d.calls.Load(), "an expired session calls no driver")

	// Close is idempotent, and then every call is closed.
	require.NoError(t, sess.Close())
	require.NoError(t, sess.Close())
	for _, err := range []error{
		func() error { _, err := sess.Create(ctx, "split.a", nil); return err }(),
		func() error { _, err := sess.Update(ctx, "split.a", nil, 3); return err }(),
		sess.KeepAlive(ctx),
	} {
		assert.ErrorIs(t, err, spate.ErrClosed)
		assert.True(t, spate.IsFatal(err))
	}
	assert.Equal(t, int64(1), d.sessions[0].closes.Load(), "the driver session closes once")
	require.NoError(t, s.Close())
	assert.Equal(t, int64(1), d.sessions[0].closes.Load(), "the store's Close does not close a closed session again")
}

// TestPortableSessionStoreClose: the store's Close closes every open
// session before the driver, and after it every session call is closed and
// reaches no driver.
func TestPortableSessionStoreClose(t *testing.T) {
	ctx := t.Context()
	d := &sessionDriver{}
	s := driver.NewStore(d)
	a, err := s.NewSession(ctx)
	require.NoError(t, err)
	b, err := s.NewSession(ctx)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	d.mu.Lock()
	returns := d.returns[len(d.returns)-3:]
	d.mu.Unlock()
	assert.Equal(t, []string{"session-close", "session-close", "close"}, returns, "sessions close before the driver")
	for _, sess := range []spate.Session{a, b} {
		for _, err := range []error{
			func() error { _, err := sess.Create(ctx, "split.a", nil); return err }(),
			func() error { _, err := sess.Update(ctx, "split.a", nil, 3); return err }(),
			sess.KeepAlive(ctx),
		} {
			assert.ErrorIs(t, err, spate.ErrClosed)
			assert.True(t, spate.IsFatal(err))
			assert.Contains(t, err.Error(), "closed")
		}
		require.NoError(t, sess.Close(), "Close of a session of a closed store is a no-op")
	}
	_, err = s.NewSession(ctx)
	assert.ErrorIs(t, err, spate.ErrClosed)
	for _, fs := range d.sessions {
		assert.Equal(t, int64(1), fs.closes.Load())
		assert.Zero(t, fs.late.Load())
	}
	assert.Zero(t, d.late.Load(), "no call after the driver's Close")
}

// TestPortableSessionCloseCancelsKeepAlive: a KeepAlive in flight when the
// store closes has its context cancelled, and the store waits for it.
func TestPortableSessionCloseCancelsKeepAlive(t *testing.T) {
	d := &sessionDriver{}
	s := driver.NewStore(d)
	sess, err := s.NewSession(t.Context())
	require.NoError(t, err)
	d.block = make(chan struct{})
	d.entered = make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() { done <- sess.KeepAlive(t.Context()) }()
	<-d.entered
	require.NoError(t, s.Close())
	err = <-done
	assert.True(t, spate.IsRetryable(err), "a call in flight at Close may have landed: %v", err)
	assert.ErrorIs(t, err, spate.ErrClosed)
}

// TestPortableSessionCloseWaitsForItsCalls: a session's Close cancels
// the session's calls in flight and closes the driver's session only after
// they returned.
func TestPortableSessionCloseWaitsForItsCalls(t *testing.T) {
	d := &sessionDriver{}
	s := driver.NewStore(d)
	defer s.Close()
	sess, err := s.NewSession(t.Context())
	require.NoError(t, err)
	d.block = make(chan struct{})
	d.entered = make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() { done <- sess.KeepAlive(t.Context()) }()
	<-d.entered
	require.NoError(t, sess.Close())
	err = <-done
	assert.True(t, spate.IsRetryable(err), "a call in flight at Close may have landed: %v", err)
	assert.ErrorIs(t, err, spate.ErrClosed)
	d.mu.Lock()
	returns := d.returns[len(d.returns)-2:]
	d.mu.Unlock()
	assert.Equal(t, []string{"call", "session-close"}, returns, "the call returned before the session closed")
}
