package faultstore_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/faultstore"
	"github.com/spate-go/spate/stores/mem"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func setup(t *testing.T) (spate.Store, *faultstore.Injector, *mem.Store) {
	t.Helper()
	inner := mem.MustNew(mem.Options{TTL: time.Minute})
	t.Cleanup(func() { inner.Close() })
	inj := faultstore.New()
	return faultstore.Wrap(inner, inj), inj, inner
}

func TestRulesMatchSkipAndRunOut(t *testing.T) {
	s, inj, _ := setup(t)
	ctx := context.Background()
	inj.Add(faultstore.Rule{Ops: []faultstore.Op{faultstore.Create}, Keyspace: spate.Durable, KeyPrefix: "a.", Skip: 1, Times: 2})
	var got []bool
	for _, k := range []string{"a.1", "a.2", "a.3", "a.4", "b.1"} {
		_, err := s.Create(ctx, spate.Durable, k, nil)
		got = append(got, err != nil)
		if err != nil {
			require.ErrorIs(t, err, faultstore.ErrInjected, "an injected failure is Retryable ErrInjected: %v", err)
			require.True(t, spate.IsRetryable(err), "an injected failure is Retryable ErrInjected: %v", err)
		}
	}
	require.Equal(t, []bool{false, true, true, false, false}, got, "failures (skip 1, then 2 hits, prefix a. only)")
	require.Equal(t, 2, inj.Injected(), "injected")
}

func TestLandedWriteReportsAnErrorButApplies(t *testing.T) {
	s, inj, inner := setup(t)
	ctx := context.Background()
	inj.Add(faultstore.Rule{Ops: []faultstore.Op{faultstore.Create}, Landed: true, Times: 1,
		Match: func(c faultstore.Call) bool { return bytes.Equal(c.Value, []byte("v")) }})
	o, err := s.Create(ctx, spate.Durable, "k", []byte("v"))
	require.Error(t, err, "a landed write reports an error and hides its outcome: %v %v", o, err)
	require.False(t, o.Won, "a landed write reports an error and hides its outcome: %v %v", o, err)
	_, ok, _ := inner.Get(ctx, spate.Durable, "k")
	require.True(t, ok, "the write must have landed")
}

func TestLatencyIsBoundedByTheContext(t *testing.T) {
	s, inj, _ := setup(t)
	inj.Add(faultstore.Rule{Delay: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, _, err := s.Get(ctx, spate.Durable, "k")
	require.True(t, spate.IsRetryable(err), "a delayed op under an expiring context fails Retryable: %v", err)
	require.ErrorIs(t, err, context.DeadlineExceeded, "a delayed op under an expiring context fails Retryable: %v", err)
}

func TestPartitionBreaksWatchesAndHealRestores(t *testing.T) {
	s, inj, _ := setup(t)
	ctx := t.Context()
	ch, err := s.Watch(ctx, spate.Durable, "")
	require.NoError(t, err)
	ev := <-ch
	require.Equal(t, spate.WatchSnapshotDone, ev.Kind)
	inj.Partition()
	ev, ok := <-ch
	require.True(t, ok, "a partition breaks the watch Retryable: %v %v", ev, ok)
	require.Equal(t, spate.WatchError, ev.Kind, "a partition breaks the watch Retryable: %v %v", ev, ok)
	require.True(t, spate.IsRetryable(ev.Err), "a partition breaks the watch Retryable: %v %v", ev, ok)
	_, ok = <-ch
	require.False(t, ok, "the broken watch must close")
	_, err = s.Create(ctx, spate.Durable, "k", nil)
	require.True(t, spate.IsRetryable(err), "operations fail Retryable while partitioned: %v", err)
	inj.Heal()
	o, err := s.Create(ctx, spate.Durable, "k", nil)
	require.NoError(t, err, "after heal: %v %v", o, err)
	require.True(t, o.Won, "after heal: %v %v", o, err)
}

// The wrapper passes the Releaser capability on, faulted as an Update of
// the durable key, and does not invent it for a store without it.
func TestWrapPassesTheReleaserOn(t *testing.T) {
	s, inj, inner := setup(t)
	ctx := context.Background()
	r, ok := spate.ReleaserOf(s)
	require.True(t, ok, "mem has the capability, so the wrapper has it")

	rec, err := inner.Create(ctx, spate.Durable, "split.a", []byte("owned"))
	require.NoError(t, err)
	lease, err := inner.Create(ctx, spate.Ephemeral, "split.a", []byte("lease"))
	require.NoError(t, err)

	inj.Add(faultstore.Rule{Ops: []faultstore.Op{faultstore.Update}, Keyspace: spate.Durable, KeyPrefix: "split.", Times: 1})
	_, _, err = r.UpdateAndDelete(ctx, "split.a", []byte("released"), rec.Revision, "split.a", lease.Revision)
	require.ErrorIs(t, err, faultstore.ErrInjected)
	_, leased, _ := inner.Get(ctx, spate.Ephemeral, "split.a")
	assert.True(t, leased, "a failed call wrote nothing")

	inj.Add(faultstore.Rule{Ops: []faultstore.Op{faultstore.Update}, Keyspace: spate.Durable, KeyPrefix: "split.", Landed: true, Times: 1})
	u, d, err := r.UpdateAndDelete(ctx, "split.a", []byte("released"), rec.Revision, "split.a", lease.Revision)
	require.ErrorIs(t, err, faultstore.ErrInjected)
	assert.False(t, u.Won || d.Won, "a lost reply hides the outcomes")
	e, _, _ := inner.Get(ctx, spate.Durable, "split.a")
	assert.Equal(t, "released", string(e.Value), "the landed call updated")
	_, leased, _ = inner.Get(ctx, spate.Ephemeral, "split.a")
	assert.False(t, leased, "and deleted")

	_, ok = spate.ReleaserOf(faultstore.Wrap(plainStore{inner}, inj))
	assert.False(t, ok, "no capability to pass on")
}

// plainStore hides the method and the capability of the store it wraps.
type plainStore struct{ spate.Store }

func (p plainStore) Capabilities() spate.Capabilities {
	c := p.Store.Capabilities()
	c.UpdateAndDelete = false
	return c
}
