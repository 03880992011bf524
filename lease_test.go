package spate

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newTestRenewer(t testing.TB, st Store, cfg Config) *renewer {
	t.Helper()
	m, err := newCoordMetrics(nil, nil)
	require.NoError(t, err)
	return newRenewer(st, cfg, slog.New(slog.DiscardHandler), m, "me", "nonce-me", 1)
}

// holdLeases writes n leases of ours and has the renewer hold them, each
// last renewed at sent.
func holdLeases(st *fakeStore, r *renewer, n int, sent time.Time) []string {
	var ids []string
	for i := range n {
		id := fmt.Sprintf("s%03d", i)
		rev := st.put(Ephemeral, prefixSplit+id, leaseBytes("me", "nonce-me", 1))
		r.hold(id, 1, rev, sent, nil)
		ids = append(ids, id)
	}
	return ids
}

func notesOf(r *renewer) []renewNote { return r.notes.take() }

func lastRenewed(r *renewer, id string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leases[id].lastOK
}

// One beat renews every held lease concurrently: 32 leases behind a store
// with a round trip of latency take one round trip, not 32; beyond
// renewConcurrency they take a round trip per renewConcurrency leases.
func TestRenewerRenewsLeasesConcurrently(t *testing.T) {
	const rtt = 100 * time.Millisecond
	for _, c := range []struct {
		n    int
		want time.Duration
	}{{renewConcurrency, rtt}, {2 * renewConcurrency, 2 * rtt}} {
		t.Run(fmt.Sprint(c.n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := newFakeStore()
				cfg := testConfig()
				r := newTestRenewer(t, st, cfg)
				ids := holdLeases(st, r, c.n, time.Now().Add(-r.tm.renewGate))
				st.delay = rtt

				start := time.Now()
				r.beat(t.Context())
				elapsed := time.Since(start)

				assert.Equal(t, c.want, elapsed, "renewing %d leases took %v of virtual time (a serial renewer takes %v)", c.n, elapsed, time.Duration(c.n)*rtt)
				for _, id := range ids {
					e, ok := st.entry(Ephemeral, prefixSplit+id)
					require.True(t, ok)
					assert.Equal(t, e.Revision, r.leaseRev(id), "lease %s", id)
					assert.False(t, lastRenewed(r, id).Before(start), "lease %s: its renewal is recorded", id)
				}
				assert.Equal(t, c.n, st.count("update", prefixSplit))
				assert.Empty(t, notesOf(r))
			})
		})
	}
}

// Presence, the leader key and the leases renew side by side in one beat.
func TestRenewerBeatRenewsPresenceLeaderAndLeasesTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rtt = 50 * time.Millisecond
		st := newFakeStore()
		r := newTestRenewer(t, st, testConfig())
		r.presenceWritten(st.put(Ephemeral, prefixWorker+"me", r.presenceValue()))
		r.setLeader(st.put(Ephemeral, keyLeader, leaderBytes("me", "nonce-me", 4)), 4)
		holdLeases(st, r, 3, time.Now().Add(-time.Hour/100))
		st.delay = rtt
		start := time.Now()
		r.beat(t.Context())
		assert.Equal(t, rtt, time.Since(start))
		pres, _ := st.entry(Ephemeral, prefixWorker+"me")
		lead, _ := st.entry(Ephemeral, keyLeader)
		assert.Equal(t, pres.Revision, r.presRev)
		assert.Equal(t, lead.Revision, r.leaderRev())
		l, err := decodeLeader(lead.Value)
		require.NoError(t, err)
		assert.Equal(t, uint64(4), l.Generation, "the leader renewal keeps its generation")
		assert.Empty(t, notesOf(r))
	})
}

func TestRenewerSkipsALeaseWrittenJustNow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		r := newTestRenewer(t, st, testConfig())
		holdLeases(st, r, 1, time.Now())
		time.Sleep(r.tm.renewGate - time.Millisecond)
		r.beat(t.Context())
		assert.Zero(t, st.count("update", prefixSplit), "a lease written less than the gate ago is not rewritten")
		time.Sleep(time.Millisecond)
		r.beat(t.Context())
		assert.Equal(t, 1, st.count("update", prefixSplit))
	})
}

// A renewal that landed though its reply was lost moves the revision under
// the renewer: its retry, a moment later in the same beat, loses its CAS,
// finds the lease still ours at this epoch, adopts the revision and
// rewrites at once.
func TestRenewerAdoptsALandedRenewalWhoseReplyWasLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		r := newTestRenewer(t, st, testConfig())
		ids := holdLeases(st, r, 1, time.Now().Add(-r.tm.renewGate))
		id, key := ids[0], prefixSplit+ids[0]
		before := r.leaseRev(id)
		lost := 1
		st.setFault(func(c fakeCall) fakeFault {
			if c.op == "update" && c.key == key && lost > 0 {
				lost--
				return fakeFault{err: Retryablef("reply lost"), landed: true}
			}
			return fakeFault{}
		})
		start := time.Now()
		r.beat(t.Context())
		e, _ := st.entry(Ephemeral, key)
		assert.Greater(t, e.Revision, before+1, "the lost-reply write landed, and the adopted lease was rewritten")
		assert.Equal(t, e.Revision, r.leaseRev(id))
		assert.Equal(t, start.Add(r.tm.renewRetry), lastRenewed(r, id), "renewed in the same beat, after the retry wait")
		assert.Equal(t, 3, st.count("update", key), "the lost-reply write, the retry's lost CAS, the rewrite")
		assert.Empty(t, notesOf(r), "adopting costs nothing: no loss")
		assert.Equal(t, 1.0, testutil.ToFloat64(r.m.writes.WithLabelValues("conflict")))
	})
}

// A renewal that fails Retryable is tried once more within the beat, a
// moment later: one failure costs retryWait, not a third of the lease.
func TestRenewerRetriesAFailedRenewalWithinTheBeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		r := newTestRenewer(t, st, testConfig())
		ids := holdLeases(st, r, 1, time.Now().Add(-r.tm.renewGate))
		id, key := ids[0], prefixSplit+ids[0]
		fail := 1
		st.setFault(func(c fakeCall) fakeFault {
			if c.op == "update" && c.key == key && fail > 0 {
				fail--
				return fakeFault{err: Retryablef("store unreachable")}
			}
			return fakeFault{}
		})
		start := time.Now()
		r.beat(t.Context())
		assert.Equal(t, 2, st.count("update", key))
		assert.Equal(t, start.Add(r.tm.renewRetry), lastRenewed(r, id))
		assert.Empty(t, notesOf(r))
	})
}

func TestRenewerReportsALeaseItNoLongerHas(t *testing.T) {
	cases := []struct {
		name       string
		now        func(st *fakeStore, key string)
		wantReason string
		wantWhy    string
		wantCheck  bool
		wantFatal  bool
	}{
		{name: "taken by a peer", now: func(st *fakeStore, key string) { st.put(Ephemeral, key, leaseBytes("peer", "n-peer", 2)) },
			wantReason: "fenced", wantWhy: "held by peer"},
		{name: "taken by a twin of our instance id", now: func(st *fakeStore, key string) { st.put(Ephemeral, key, leaseBytes("me", "n-twin", 2)) },
			wantReason: "fenced", wantWhy: "another process with this instance id", wantCheck: true},
		{name: "ours at another epoch", now: func(st *fakeStore, key string) { st.put(Ephemeral, key, leaseBytes("me", "nonce-me", 9)) },
			wantReason: "fenced", wantWhy: "held by me"},
		{name: "expired", now: func(st *fakeStore, key string) { st.remove(Ephemeral, key) },
			wantReason: "starved", wantWhy: "expired"},
		{name: "alien", now: func(st *fakeStore, key string) { st.put(Ephemeral, key, []byte(`{"schema":7}`)) }, wantFatal: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := newFakeStore()
				r := newTestRenewer(t, st, testConfig())
				ids := holdLeases(st, r, 2, time.Now().Add(-r.tm.renewGate))
				c.now(st, prefixSplit+ids[0])
				r.beat(t.Context())
				notes := notesOf(r)
				require.Len(t, notes, 1)
				n := notes[0]
				if c.wantFatal {
					assert.Equal(t, noteFatal, n.kind)
					assert.True(t, IsFatal(n.err), "%v", n.err)
					return
				}
				assert.Equal(t, noteLost, n.kind)
				assert.Equal(t, ids[0], n.id)
				assert.Equal(t, uint64(1), n.epoch)
				assert.Equal(t, c.wantReason, n.reason)
				assert.Contains(t, n.why, c.wantWhy)
				assert.NotContains(t, r.leases, ids[0], "a lost lease is no longer renewed")
				assert.Contains(t, r.leases, ids[1], "the other lease is unaffected")
				assert.Equal(t, c.wantCheck, len(r.check) == 1, "presence check requested")
			})
		})
	}
}

// A tenancy no renewal reached the store for in a whole lease is
// self-fenced: it may already be another's.
func TestRenewerSelfFencesAStarvedLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		cfg := testConfig()
		r := newTestRenewer(t, st, cfg)
		old := holdLeases(st, r, 1, time.Now().Add(-cfg.LeaseDuration))
		recent := []string{"r"}
		r.hold("r", 3, st.put(Ephemeral, prefixSplit+"r", leaseBytes("me", "nonce-me", 3)), time.Now().Add(-cfg.LeaseDuration/2), nil)
		st.setFault(func(c fakeCall) fakeFault { return fakeFault{err: Retryablef("store down")} })
		r.beat(t.Context())
		notes := notesOf(r)
		require.Len(t, notes, 1)
		assert.Equal(t, renewNote{kind: noteLost, id: old[0], epoch: 1, reason: "starved",
			why: "self-fenced: no lease renewal reached the store for a whole lease"}, notes[0])
		assert.NotContains(t, r.leases, old[0])
		assert.Contains(t, r.leases, recent[0], "half a lease without a renewal is not yet a self-fence")
	})
}

// A renewal that lands keeps a lease alive past the self-fence horizon,
// even when it finishes late.
func TestRenewerNoSelfFenceAfterALateRenewalLanded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		cfg := testConfig()
		r := newTestRenewer(t, st, cfg)
		holdLeases(st, r, 1, time.Now().Add(-cfg.LeaseDuration+time.Second))
		st.delay = 2 * time.Second // the renewal is sent in time and answered late
		r.beat(t.Context())
		assert.Empty(t, notesOf(r))
	})
}

func TestRenewerLeader(t *testing.T) {
	t.Run("renewed", func(t *testing.T) {
		st := newFakeStore()
		r := newTestRenewer(t, st, testConfig())
		r.setLeader(st.put(Ephemeral, keyLeader, leaderBytes("me", "nonce-me", 2)), 2)
		r.renewLeader(t.Context())
		e, _ := st.entry(Ephemeral, keyLeader)
		assert.Equal(t, e.Revision, r.leaderRev())
		assert.Empty(t, notesOf(r))
	})
	t.Run("fenced: demote", func(t *testing.T) {
		st := newFakeStore()
		r := newTestRenewer(t, st, testConfig())
		r.setLeader(st.put(Ephemeral, keyLeader, leaderBytes("me", "nonce-me", 2)), 2)
		st.put(Ephemeral, keyLeader, leaderBytes("peer", "np", 3))
		r.renewLeader(t.Context())
		assert.Equal(t, []renewNote{{kind: noteDemote, why: "renewal fenced"}}, notesOf(r))
		assert.Zero(t, r.leaderRev(), "no longer renewed")
		assert.Zero(t, r.clearLeader())
	})
	t.Run("a store error changes nothing", func(t *testing.T) {
		st := newFakeStore()
		r := newTestRenewer(t, st, testConfig())
		rev := st.put(Ephemeral, keyLeader, leaderBytes("me", "nonce-me", 2))
		r.setLeader(rev, 2)
		st.setFault(func(fakeCall) fakeFault { return fakeFault{err: Retryablef("down")} })
		r.renewLeader(t.Context())
		assert.Equal(t, rev, r.leaderRev())
		assert.Empty(t, notesOf(r))
	})
}

// The renewer runs on its own schedule: leases are renewed every beat, and
// a presence check runs at once, without waiting for the next beat.
func TestRenewerRunsOnItsOwnSchedule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		cfg := testConfig()
		r := newTestRenewer(t, st, cfg)
		r.presenceWritten(st.put(Ephemeral, prefixWorker+"me", r.presenceValue()))
		ids := holdLeases(st, r, 4, time.Now())
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.run(ctx)
		}()

		r.checkPresence()
		synctest.Wait()
		assert.Equal(t, 1, st.count("update", prefixWorker), "a presence check runs at once")

		time.Sleep(3 * cfg.LeaseDuration)
		synctest.Wait()
		assert.Empty(t, notesOf(r), "every lease stayed renewed")
		for _, id := range ids {
			assert.GreaterOrEqual(t, st.count("update", prefixSplit+id), 4, "lease %s renewed at least every ~0.63 lease", id)
			assert.Less(t, time.Since(lastRenewed(r, id)), cfg.LeaseDuration*2/3)
		}
		cancel()
		<-done
	})
}

func TestBeatIntervalJitter(t *testing.T) {
	cfg := testConfig()
	r1 := newRenewer(nil, cfg, nil, nil, "a", "n", 1)
	r2 := newRenewer(nil, cfg, nil, nil, "a", "n", 2)
	lo, hi := time.Duration(float64(cfg.LeaseDuration/3)*0.8), time.Duration(float64(cfg.LeaseDuration/3)*1.2)
	differ := 0
	for range 1000 {
		d1, d2 := r1.beatInterval(), r2.beatInterval()
		for _, d := range []time.Duration{d1, d2} {
			require.GreaterOrEqual(t, d, lo)
			require.Less(t, d, hi)
		}
		if d1 != d2 {
			differ++
		}
	}
	assert.Greater(t, differ, 900, "workers with different seeds drift apart instead of herding")
	assert.Equal(t, cfg.LeaseDuration/3*7/10, r1.tm.renewGate)
}

// ----- the loop's side ----------------------------------------------------------

func TestOnRenewNotes(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 3, nil)
	holdSplit(t, a, st, "t", 3, nil)
	require.NoError(t, a.onRenewNotes([]renewNote{{kind: noteLost, id: "s", epoch: 2, reason: "fenced"}}))
	assert.Contains(t, a.worker.owned, "s", "a note about an earlier tenancy is ignored")
	require.NoError(t, a.onRenewNotes([]renewNote{
		{kind: noteLost, id: "s", epoch: 3, reason: "starved", why: "self-fenced"},
		{kind: noteLost, id: "t", epoch: 3, reason: "fenced", why: "held by peer"},
		{kind: noteLost, id: "unknown", epoch: 1, reason: "fenced"},
	}))
	assert.Empty(t, a.worker.owned)
	assert.Equal(t, []string{"s", "t"}, lostSplits(events(t, a)))
	assert.Equal(t, uint64(3), a.worker.selfFenced["s"], "a starved tenancy is self-fenced: its re-claim is attempt-free once")
	assert.NotContains(t, a.worker.selfFenced, "t")
	assert.Equal(t, 1.0, testutil.ToFloat64(a.m.losses.WithLabelValues("starved")))
	assert.Equal(t, 1.0, testutil.ToFloat64(a.m.losses.WithLabelValues("fenced")))

	a.leader.term = &leadership{generation: 1}
	require.NoError(t, a.onRenewNotes([]renewNote{{kind: noteDemote, why: "renewal fenced"}}))
	assert.Nil(t, a.leader.term)

	fatal := Fatalf("twin")
	err := a.onRenewNotes([]renewNote{{kind: noteFatal, err: fatal}, {kind: noteDemote}})
	assert.Same(t, fatal, err)
}

// The renewer's notes reach the loop through a box whose sender never
// blocks, however many notes pile up.
func TestRenewerNotesNeverBlock(t *testing.T) {
	b := newSignalQueue[renewNote]()
	for i := range 1000 {
		b.put(renewNote{kind: noteLost, id: fmt.Sprint(i)})
	}
	assert.Len(t, b.sig, 1)
	got := b.take()
	require.Len(t, got, 1000)
	assert.Equal(t, "0", got[0].id)
	assert.Equal(t, "999", got[999].id)
	assert.Empty(t, b.take())
}

// ----- leases bound to a session ------------------------------------------------

// fakeSessioner is the fake store with the Sessioner capability: a
// session's writes are the store's; KeepAlive answers keepAlive.
type fakeSessioner struct {
	*fakeStore
	keepAlive func() error
	kept      int // KeepAlive calls
	opened    int // NewSession calls
}

func (f *fakeSessioner) Capabilities() Capabilities {
	c := f.fakeStore.Capabilities()
	c.Sessions = true
	return c
}

func (f *fakeSessioner) NewSession(context.Context) (Session, error) {
	f.mu.Lock()
	f.opened++
	f.mu.Unlock()
	return &fakeSession{f: f}, nil
}

type fakeSession struct{ f *fakeSessioner }

func (s *fakeSession) Create(ctx context.Context, key string, value []byte) (Outcome, error) {
	return s.f.Create(ctx, Ephemeral, key, value)
}

func (s *fakeSession) Update(ctx context.Context, key string, value []byte, expected uint64) (Outcome, error) {
	return s.f.Update(ctx, Ephemeral, key, value, expected)
}

func (s *fakeSession) KeepAlive(context.Context) error {
	s.f.mu.Lock()
	s.f.kept++
	ka := s.f.keepAlive
	s.f.mu.Unlock()
	if ka != nil {
		return ka()
	}
	return nil
}

func (s *fakeSession) Close() error { return nil }

// holdBound has the renewer hold n leases bound to its session.
func holdBound(t *testing.T, st *fakeSessioner, r *renewer, n int) []string {
	t.Helper()
	sh := r.session()
	require.NotNil(t, sh, "a session is open")
	var ids []string
	for i := range n {
		id := fmt.Sprintf("b%03d", i)
		o, err := sh.s.Create(t.Context(), prefixSplit+id, leaseBytes("me", "nonce-me", 1))
		require.NoError(t, err)
		r.hold(id, 1, o.Revision, time.Now(), sh)
		ids = append(ids, id)
	}
	return ids
}

// On a store with sessions a beat renews 50 held leases with one
// KeepAlive and no lease write, and the leases' clocks follow the
// session's.
func TestRenewerKeepsBoundLeasesWithOneKeepAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &fakeSessioner{fakeStore: newFakeStore()}
		r := newTestRenewer(t, st, testConfig())
		r.beat(t.Context()) // opens the session
		require.Equal(t, 1, st.opened)
		ids := holdBound(t, st, r, 50)
		time.Sleep(testConfig().LeaseDuration / 2)
		updates := st.count("update", prefixSplit)
		start := time.Now()
		r.beat(t.Context())
		assert.Equal(t, 1, st.kept, "one keep-alive per beat")
		assert.Equal(t, updates, st.count("update", prefixSplit), "no lease is rewritten")
		for _, id := range ids {
			assert.False(t, lastRenewed(r, id).Before(start), "lease %s: the keep-alive renewed it", id)
		}
		// A whole lease of beats: nothing starves.
		for range 6 {
			time.Sleep(testConfig().LeaseDuration / 3)
			r.beat(t.Context())
		}
		assert.Empty(t, notesOf(r))
		assert.Equal(t, updates, st.count("update", prefixSplit), "no lease is rewritten")
	})
}

// A session that expired takes its leases with it (each reported lost),
// and the next beat opens a new one.
func TestRenewerLosesBoundLeasesWithTheirSession(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &fakeSessioner{fakeStore: newFakeStore()}
		r := newTestRenewer(t, st, testConfig())
		r.beat(t.Context())
		ids := holdBound(t, st, r, 3)
		st.keepAlive = func() error { return fmt.Errorf("lease not found: %w: %w", ErrSessionExpired, ErrFatal) }
		r.beat(t.Context())
		var lost []string
		for _, n := range notesOf(r) {
			assert.Equal(t, noteLost, n.kind)
			lost = append(lost, n.id)
		}
		assert.ElementsMatch(t, ids, lost)
		assert.Nil(t, r.session(), "the expired session is dropped")
		st.keepAlive = nil
		r.beat(t.Context())
		assert.Equal(t, 2, st.opened, "a new session is opened")
		assert.NotNil(t, r.session())
	})
}

// Keep-alives that fail (Retryable) for a whole lease self-fence the
// bound leases, as failing renewals do.
func TestRenewerStarvesBoundLeasesWhenKeepAlivesFail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &fakeSessioner{fakeStore: newFakeStore()}
		cfg := testConfig()
		r := newTestRenewer(t, st, cfg)
		r.beat(t.Context())
		ids := holdBound(t, st, r, 2)
		st.keepAlive = func() error { return Retryablef("store unreachable") }
		deadline := time.Now().Add(cfg.LeaseDuration + cfg.LeaseDuration/3)
		var lost []string
		for time.Now().Before(deadline) && len(lost) < len(ids) {
			time.Sleep(cfg.LeaseDuration / 3)
			r.beat(t.Context())
			for _, n := range notesOf(r) {
				lost = append(lost, n.id)
			}
		}
		assert.ElementsMatch(t, ids, lost, "the bound leases self-fence after a whole lease without a keep-alive")
	})
}
