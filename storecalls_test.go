package spate

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// deadlineSessioner is a store with sessions whose calls record whether
// their context had a deadline.
type deadlineSessioner struct {
	*fakeStore
	deadlines []bool
}

func (d *deadlineSessioner) Capabilities() Capabilities {
	c := d.fakeStore.Capabilities()
	c.Sessions = true
	return c
}

func (d *deadlineSessioner) NewSession(ctx context.Context) (Session, error) {
	_, ok := ctx.Deadline()
	d.deadlines = append(d.deadlines, ok)
	return &deadlineSession{d: d}, nil
}

type deadlineSession struct{ d *deadlineSessioner }

func (s *deadlineSession) note(ctx context.Context) {
	_, ok := ctx.Deadline()
	s.d.deadlines = append(s.d.deadlines, ok)
}

func (s *deadlineSession) Create(ctx context.Context, _ string, _ []byte) (Outcome, error) {
	s.note(ctx)
	return Won(1), nil
}

func (s *deadlineSession) Update(ctx context.Context, _ string, _ []byte, exp uint64) (Outcome, error) {
	s.note(ctx)
	return Won(exp + 1), nil
}

func (s *deadlineSession) KeepAlive(ctx context.Context) error {
	s.note(ctx)
	return nil
}

func (s *deadlineSession) Close() error { return nil }

// The coordinator's metered wrapper passes the Sessioner capability on,
// bounding every session call by the op timeout, and reports it only when
// it does.
func TestMeteredStorePassesSessionsOn(t *testing.T) {
	m, err := newCoordMetrics(nil, nil)
	require.NoError(t, err)
	plain := newMeteredStore(newFakeStore(), time.Second, time.Second, m)
	assert.False(t, plain.Capabilities().Sessions)
	_, ok := SessionerOf(plain)
	assert.False(t, ok)
	_, err = plain.NewSession(t.Context())
	assert.True(t, IsFatal(err), "%v", err)

	st := &deadlineSessioner{fakeStore: newFakeStore()}
	ms := newMeteredStore(st, time.Second, time.Second, m)
	assert.True(t, ms.Capabilities().Sessions)
	sr, ok := SessionerOf(ms)
	require.True(t, ok)
	sess, err := sr.NewSession(context.Background())
	require.NoError(t, err)
	_, err = sess.Create(context.Background(), "split.a", nil)
	require.NoError(t, err)
	_, err = sess.Update(context.Background(), "split.a", nil, 1)
	require.NoError(t, err)
	require.NoError(t, sess.KeepAlive(context.Background()))
	require.NoError(t, sess.Close())
	assert.Equal(t, []bool{true, true, true, true}, st.deadlines, "NewSession, Create, Update and KeepAlive are bounded by the op timeout")
}
