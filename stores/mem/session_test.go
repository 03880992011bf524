package mem_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/faultstore"
	"github.com/spate-go/spate/stores/mem"
)

// clock is a hand-driven store clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// With an injected clock, a session's keys expire when its deadline
// passes on that clock: KeepAlive moves the deadline, and nothing else
// (not a write of a bound key) does.
func TestSessionDeadlineOnAnInjectedClock(t *testing.T) {
	ctx := t.Context()
	c := &clock{now: time.Unix(1000, 0)}
	s := mem.MustNew(mem.Options{TTL: 10 * time.Second, Now: c.Now})
	defer s.Close()
	sess, err := s.NewSession(ctx)
	require.NoError(t, err)
	o, err := sess.Create(ctx, "k", []byte("v"))
	require.NoError(t, err)
	require.True(t, o.Won)

	c.advance(9 * time.Second)
	require.NoError(t, sess.KeepAlive(ctx)) // deadline: 19s
	c.advance(9 * time.Second)
	o, err = sess.Update(ctx, "k", []byte("w"), o.Revision) // a write does not move it
	require.NoError(t, err)
	require.True(t, o.Won)
	c.advance(999 * time.Millisecond)
	en, ok, err := s.Get(ctx, spate.Ephemeral, "k")
	require.NoError(t, err)
	require.True(t, ok, "alive until the deadline")
	assert.Equal(t, o.Revision, en.Revision, "KeepAlive wrote nothing")
	c.advance(time.Millisecond)
	_, ok, err = s.Get(ctx, spate.Ephemeral, "k")
	require.NoError(t, err)
	assert.False(t, ok, "gone at the session's deadline, though written 1s ago")
	err = sess.KeepAlive(ctx)
	assert.ErrorIs(t, err, spate.ErrSessionExpired)
	assert.True(t, spate.IsFatal(err))
}

// Options.Faults sees a session's calls: Create and Update as those ops
// on the ephemeral key, KeepAlive as faultstore.KeepAlive.
func TestSessionFaults(t *testing.T) {
	ctx := t.Context()
	inj := faultstore.New()
	s := mem.MustNew(mem.Options{TTL: time.Minute, Faults: inj})
	defer s.Close()
	sess, err := s.NewSession(ctx)
	require.NoError(t, err)

	remove := inj.Add(faultstore.Rule{Ops: []faultstore.Op{faultstore.KeepAlive}})
	err = sess.KeepAlive(ctx)
	assert.True(t, spate.IsRetryable(err), "%v", err)
	assert.ErrorIs(t, err, faultstore.ErrInjected)
	remove()
	require.NoError(t, sess.KeepAlive(ctx))

	remove = inj.Add(faultstore.Rule{Ops: []faultstore.Op{faultstore.Create}, Keyspace: spate.Ephemeral, KeyPrefix: "k"})
	_, err = sess.Create(ctx, "k", nil)
	assert.ErrorIs(t, err, faultstore.ErrInjected)
	remove()
	o, err := sess.Create(ctx, "k", nil)
	require.NoError(t, err)
	remove = inj.Add(faultstore.Rule{Ops: []faultstore.Op{faultstore.Update}, Keyspace: spate.Ephemeral})
	_, err = sess.Update(ctx, "k", nil, o.Revision)
	assert.ErrorIs(t, err, faultstore.ErrInjected)
	remove()
}
