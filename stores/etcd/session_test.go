package etcd_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/etcdservers"
	"github.com/spate-go/spate/stores/etcd"
)

// A session is one lease however many keys it carries; a Store.Update or
// Delete of a bound key (whose superseded lease is then the session's)
// never revokes it, and Close does.
func TestSessionIsOneLeaseThatRewritesDoNotRevoke(t *testing.T) {
	t.Parallel()
	c := etcdservers.Start(t, etcdservers.Options{})
	admin := c.Client(t, nil)
	ctx := t.Context()
	count := func() int {
		t.Helper()
		resp, err := admin.Leases(ctx)
		require.NoError(t, err)
		return len(resp.Leases)
	}
	s, err := etcd.New(ctx, c.Client(t, nil), opts(etcdservers.FreshPrefix()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	reaped := make(chan clientv3.LeaseID, 64)
	etcd.SetReapHook(s, func(id clientv3.LeaseID) { reaped <- id })
	require.True(t, s.Capabilities().Sessions)

	sess, err := s.NewSession(ctx)
	require.NoError(t, err)
	revs := map[string]uint64{}
	for _, k := range []string{"a", "b", "c"} {
		o, err := sess.Create(ctx, k, []byte("v"))
		require.NoError(t, err)
		require.True(t, o.Won)
		revs[k] = o.Revision
	}
	assert.Equal(t, 1, count(), "three bound keys, one lease")

	// Unbind a (a fresh lease of its own), delete b: the session's lease is
	// superseded twice, and must survive.
	u, err := s.Update(ctx, spate.Ephemeral, "a", []byte("plain"), revs["a"])
	require.NoError(t, err)
	require.True(t, u.Won)
	recvLease(t, reaped)
	d, err := s.Delete(ctx, spate.Ephemeral, "b", revs["b"])
	require.NoError(t, err)
	require.True(t, d.Won)
	recvLease(t, reaped)
	require.NoError(t, sess.KeepAlive(ctx), "the session outlives the rewrite and delete of its keys")
	_, ok, err := s.Get(ctx, spate.Ephemeral, "c")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, 2, count(), "the session's lease and a's own")

	// Delete the session's last key: its lease carries only the marker,
	// and still survives.
	d, err = s.Delete(ctx, spate.Ephemeral, "c", spate.AnyRevision)
	require.NoError(t, err)
	require.True(t, d.Won)
	recvLease(t, reaped)
	require.NoError(t, sess.KeepAlive(ctx), "a session with no bound key left lives on")

	require.NoError(t, sess.Close())
	assert.Equal(t, 1, count(), "Close revokes the session's lease")
	_, ok, err = s.Get(ctx, spate.Ephemeral, "a")
	require.NoError(t, err)
	assert.True(t, ok, "an unbound key outlives the session's Close")
}
