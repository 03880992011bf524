package spate

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// budgeted retries a Retryable phase with backoff from 200ms, doubling,
// capped at 5s, and gives up Fatal after StartupMaxAttempts.
func TestBudgetedBackoffAndGiveUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var at []time.Duration
		start := time.Now()
		err := budgeted(t.Context(), slog.New(slog.DiscardHandler), 8, "probe", func(context.Context) error {
			at = append(at, time.Since(start))
			return Retryablef("down")
		})
		require.Error(t, err)
		assert.True(t, IsFatal(err), "%v", err)
		assert.Contains(t, err.Error(), "probe failed 8 times")
		ms := time.Millisecond
		assert.Equal(t, []time.Duration{0, 200 * ms, 600 * ms, 1400 * ms, 3000 * ms, 6200 * ms, 11200 * ms, 16200 * ms}, at,
			"attempts after 200ms, 400ms, 800ms, 1.6s, 3.2s, then 5s each")
	})
}

func TestBudgetedStopsAtOnceOnANonRetryableError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		fatal := Fatalf("misconfigured")
		err := budgeted(t.Context(), slog.New(slog.DiscardHandler), 8, "join", func(context.Context) error { calls++; return fatal })
		assert.Same(t, fatal, err)
		assert.Equal(t, 1, calls)

		calls = 0
		start := time.Now()
		err = budgeted(t.Context(), slog.New(slog.DiscardHandler), 8, "join", func(context.Context) error {
			calls++
			if calls < 3 {
				return Retryablef("blip")
			}
			return nil
		})
		assert.NoError(t, err)
		assert.Equal(t, 3, calls)
		assert.Equal(t, 600*time.Millisecond, time.Since(start))
	})
}

func TestBudgetedReturnsOnCancellation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(100*time.Millisecond, cancel)
		err := budgeted(ctx, slog.New(slog.DiscardHandler), 8, "probe", func(context.Context) error { return Retryablef("down") })
		assert.ErrorIs(t, err, context.Canceled)
	})
}

// ----- probe ------------------------------------------------------------------------

// brokenStore breaks one rule of the store contract.
type brokenStore struct {
	*fakeStore
	createAlwaysWins bool
	staleUpdateWins  bool
}

func (b *brokenStore) Create(ctx context.Context, ks Keyspace, key string, v []byte) (Outcome, error) {
	if b.createAlwaysWins {
		rev := b.put(ks, key, v)
		return Won(rev), nil
	}
	return b.fakeStore.Create(ctx, ks, key, v)
}

func (b *brokenStore) Update(ctx context.Context, ks Keyspace, key string, v []byte, exp uint64) (Outcome, error) {
	if b.staleUpdateWins {
		if _, ok := b.entry(ks, key); ok {
			return Won(b.put(ks, key, v)), nil
		}
	}
	return b.fakeStore.Update(ctx, ks, key, v, exp)
}

func TestProbe(t *testing.T) {
	for _, ks := range []Keyspace{Durable, Ephemeral} {
		t.Run(ks.String(), func(t *testing.T) {
			st := newFakeStore()
			a := newTestActor(t, st, testConfig())
			require.NoError(t, a.probe(t.Context(), ks))
			assert.Empty(t, st.listNow(ks, ""), "the probe cleans up after itself")

			for name, broken := range map[string]*brokenStore{
				"create-if-absent is not enforced":  {fakeStore: newFakeStore(), createAlwaysWins: true},
				"an update at a stale revision won": {fakeStore: newFakeStore(), staleUpdateWins: true},
			} {
				b := newTestActor(t, broken, testConfig())
				err := b.probe(t.Context(), ks)
				assert.True(t, IsFatal(err), "%s: %v", name, err)
				assert.ErrorContains(t, err, name)
				assert.ErrorContains(t, err, "fake store")
			}
		})
	}
}

// A probe key a crashed predecessor left is cleared and the probe retried.
func TestProbeClearsALeftoverKey(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	key := prefixProbe + a.self + "." + a.nonce
	st.put(Durable, key, []byte("old"))
	err := a.probe(t.Context(), Durable)
	assert.True(t, IsRetryable(err), "%v", err)
	_, ok := st.entry(Durable, key)
	assert.False(t, ok)
	require.NoError(t, a.probe(t.Context(), Durable))
}

// ----- join, announce -------------------------------------------------------------

func TestJoin(t *testing.T) {
	t.Run("creates the plan of a new job", func(t *testing.T) {
		st := newFakeStore()
		a := newTestActor(t, st, testConfig())
		require.NoError(t, a.join(t.Context()))
		p, rev := storedPlan(t, st)
		assert.Equal(t, rev, a.planning.planRev)
		assert.Equal(t, testFP, p.Fingerprint)
		assert.Equal(t, finalityOpen, p.Finality)
		assert.Zero(t, p.Generation)
	})
	t.Run("reads an existing plan", func(t *testing.T) {
		st := newFakeStore()
		p := &planRecord{Schema: SchemaVersion, Fingerprint: testFP, Finality: finalityFinal, Generation: 7, Planned: 3}
		rev := st.put(Durable, keyPlan, encode(p))
		a := newTestActor(t, st, testConfig())
		require.NoError(t, a.join(t.Context()))
		assert.Equal(t, *p, *a.planning.plan)
		assert.Equal(t, rev, a.planning.planRev)
		assert.Zero(t, st.count("create", keyPlan))
	})
	t.Run("a diverging fingerprint is Fatal and writes nothing", func(t *testing.T) {
		st := newFakeStore()
		st.put(Durable, keyPlan, encode(&planRecord{Schema: SchemaVersion, Fingerprint: "job:other", Finality: finalityOpen}))
		a := newTestActor(t, st, testConfig())
		err := a.join(t.Context())
		assert.True(t, IsFatal(err))
		assert.ErrorContains(t, err, "job:other")
		assert.Nil(t, a.planning.plan)
		assert.Zero(t, st.count("create", "")+st.count("update", ""))
	})
}

func TestAnnounce(t *testing.T) {
	key := prefixWorker + "me"
	t.Run("creates the presence record", func(t *testing.T) {
		st := newFakeStore()
		a := newTestActor(t, st, testConfig())
		require.NoError(t, a.announce(t.Context()))
		e, ok := st.entry(Ephemeral, key)
		require.True(t, ok)
		assert.Equal(t, e.Revision, a.renew.presRev)
		assert.Equal(t, e.Revision, a.renew.presWritten)
	})
	t.Run("adopts a predecessor's record", func(t *testing.T) {
		st := newFakeStore()
		old := st.put(Ephemeral, key, workerBytes("crashed-predecessor", 4))
		a := newTestActor(t, st, testConfig())
		require.NoError(t, a.announce(t.Context()))
		e, _ := st.entry(Ephemeral, key)
		assert.Greater(t, e.Revision, old)
		w, err := decodeWorker(key, e.Value)
		require.NoError(t, err)
		assert.Equal(t, "nonce-me", w.Nonce)
		assert.Equal(t, e.Revision, a.renew.presWritten, "our write is the one the renewer now defends")
	})
}

// startup runs every phase and applies both watch snapshots before the
// loop starts, so the first decisions see the whole job.
func TestStartupSeesTheWholeJob(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		p := &planRecord{Schema: SchemaVersion, Fingerprint: testFP, Finality: finalityFinal, Planned: 1}
		st.put(Durable, keyPlan, encode(p))
		st.put(Durable, prefixSplit+"s", encode(rec("s", 0, "")))
		st.put(Ephemeral, prefixWorker+"peer", workerBytes("np", 2))
		a := newTestActor(t, st, testConfig())
		require.NoError(t, a.startup(a.ctx))
		assert.Equal(t, 1, a.job.nSplits)
		assert.Contains(t, a.members.presence, "peer")
		assert.Contains(t, a.members.presence, "me", "our own announced presence came back through the watch")
		assert.True(t, a.members.joinLogged)
		for _, w := range a.w.streams {
			assert.NotNil(t, w.ch)
			assert.False(t, w.collecting)
		}
	})
}

func TestStartupFailsOnAFatalPhase(t *testing.T) {
	st := newFakeStore()
	st.put(Durable, keyPlan, encode(&planRecord{Schema: SchemaVersion, Fingerprint: "job:other", Finality: finalityOpen}))
	a := newTestActor(t, st, testConfig())
	err := a.startup(a.ctx)
	require.Error(t, err)
	assert.True(t, IsFatal(err))
	assert.False(t, errors.Is(err, ErrRetryable))
	assert.Zero(t, st.count("create", prefixWorker), "no presence announced for a job this worker cannot join")
}
