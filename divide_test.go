package spate_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/faultstore"
	"github.com/spate-go/spate/stores/mem"
)

// Runtime division, proven the way Beam checks a restriction tracker's
// trySplit: on a small split, a division at EVERY position of every read
// position is either refused (nothing written, the split read whole) or
// leaves a primary and a residual that together are the original and do
// not overlap; either way the job's output holds every record exactly
// once. The owner is also killed or frozen before, during and after the
// division's commit.

// rangeDesc is an integer range [lo, hi) as a descriptor.
func rangeDesc(lo, hi int64) []byte {
	b := make([]byte, 16)
	binary.BigEndian.PutUint64(b, uint64(lo))
	binary.BigEndian.PutUint64(b[8:], uint64(hi))
	return b
}

func rangeOf(t testing.TB, d []byte) (lo, hi int64) {
	require.Len(t, d, 16, "a range descriptor")
	return int64(binary.BigEndian.Uint64(d)), int64(binary.BigEndian.Uint64(d[8:]))
}

// sink is the job's exactly-once output: a range of records is published
// only when the commit that lists it won its compare-and-swap.
type sink struct {
	mu  sync.Mutex
	out map[int64]int
}

func (s *sink) publish(lo, hi int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := lo; k < hi; k++ {
		s.out[k]++
	}
}

// check reports the duplicates and the losses against [0, n).
func (s *sink) check(t *testing.T, n int64) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var dups, lost []int64
	for k := range n {
		switch c := s.out[k]; {
		case c == 0:
			lost = append(lost, k)
		case c > 1:
			dups = append(dups, k)
		}
	}
	for k := range s.out {
		if k < 0 || k >= n {
			dups = append(dups, k)
		}
	}
	assert.Empty(t, dups, "records published more than once (or outside the input)")
	assert.Empty(t, lost, "records never published")
}

// rangeTenancy is one split a rangeWorker reads: [lo, hi), read up to read
// (exclusive), committed up to committed.
type rangeTenancy struct {
	epoch           spate.LeaseEpoch
	lo, hi          int64
	read, committed int64
}

// rangeWorker is a source over integer ranges: it reads one record per
// pump and commits it at once, listing it as its output.
type rangeWorker struct {
	t      *testing.T
	c      *spate.StoreCoordinator
	inj    *faultstore.Injector
	sink   *sink
	held   map[spate.SplitID]*rangeTenancy
	done   bool
	frozen bool  // a frozen process reads and commits nothing
	limit  int64 // read no further (tests position the reader)
	// auto: its commits report what is left (Remaining), and it divides
	// a split the leader asks it to (DivideRequested) in the middle of
	// what it has not read; asked counts those asks, published the
	// records it published.
	auto      bool
	asked     int
	published int64
}

func startRange(t *testing.T, s spate.Store, id string, p spate.SplitPlanner, out *sink) *rangeWorker {
	t.Helper()
	return startRangeWith(t, s, testCfg(id), p, out)
}

func startRangeWith(t *testing.T, s spate.Store, cfg spate.Config, p spate.SplitPlanner, out *sink) *rangeWorker {
	t.Helper()
	inj := faultstore.New()
	c, err := spate.NewStoreCoordinator(faultstore.Wrap(s, inj), cfg)
	require.NoError(t, err)
	require.NoError(t, c.Start(p))
	t.Cleanup(func() { c.Close() })
	return &rangeWorker{t: t, c: c, inj: inj, sink: out, held: map[spate.SplitID]*rangeTenancy{}, limit: 1 << 62}
}

func (w *rangeWorker) pump() {
	if w.frozen {
		return
	}
	evs, err := w.c.Poll()
	require.NoError(w.t, err, "poll")
	for _, ev := range evs {
		switch e := ev.(type) {
		case spate.Gained:
			lo, hi := rangeOf(w.t, e.Split.Descriptor)
			at := lo
			if e.Progress != nil {
				at = e.Progress.Watermark
			}
			w.held[e.Split.ID] = &rangeTenancy{epoch: e.Epoch, lo: lo, hi: hi, read: at, committed: at}
		case spate.Lost:
			delete(w.held, e.Split)
		case spate.RevokeRequested:
			if ten := w.held[e.Split]; ten != nil && w.commit(e.Split, ten) {
				_ = w.c.ReleaseDrained(context.Background(), e.Split)
				delete(w.held, e.Split)
			}
		case spate.DivideRequested:
			w.asked++
			if ten := w.held[e.Split]; w.auto && ten != nil {
				_, err := w.divide(e.Split, (ten.read+ten.hi)/2)
				require.NoError(w.t, err, "an asked division")
			}
		case spate.AllComplete:
			w.done = true
		}
	}
	for id, ten := range w.held {
		if ten.read < min(ten.hi, w.limit) {
			ten.read++
		}
		if ten.read > ten.committed || ten.read == ten.hi {
			w.commit(id, ten)
		}
	}
}

// commit commits what was read; it reports whether the tenancy goes on.
func (w *rangeWorker) commit(id spate.SplitID, ten *rangeTenancy) bool {
	p := spate.SplitProgress{Watermark: ten.read, Completed: ten.read == ten.hi,
		Output: rangeDesc(ten.committed, ten.read)}
	if w.auto {
		p.Remaining = uint64(ten.hi - ten.read)
	}
	err := w.c.CommitAt(context.Background(), id, ten.epoch, p)
	switch {
	case err == nil:
		w.sink.publish(ten.committed, ten.read)
		w.published += ten.read - ten.committed
		ten.committed = ten.read
		if p.Completed {
			delete(w.held, id)
			return false
		}
		return true
	case spate.IsFenced(err):
		delete(w.held, id) // staged output is discarded, never published
		return false
	}
	return true // retried at the next pump, the same range listed again
}

// divide is the source's side of a division: it refuses a position it has
// read past or at the end of its range (there is nothing to give), and
// otherwise proposes it to the coordinator, keeping the primary if the
// division is durable.
func (w *rangeWorker) divide(id spate.SplitID, pos int64) (accepted bool, err error) {
	ten := w.held[id]
	require.NotNil(w.t, ten, "dividing a split the worker does not hold")
	if pos < ten.read || pos >= ten.hi {
		return false, nil
	}
	_, err = w.c.Divide(context.Background(), id, ten.epoch, spate.Division{Position: pos,
		Primary: rangeDesc(ten.lo, pos), PrimaryWeight: uint64(pos - ten.lo),
		Residual: rangeDesc(pos, ten.hi), ResidualWeight: uint64(ten.hi - pos)})
	switch {
	case err == nil:
		ten.hi = pos
		return true, nil
	case spate.IsFenced(err) || !errorsIsRefused(err):
		delete(w.held, id) // the tenancy is over or in doubt: stop reading
		if !spate.IsFenced(err) {
			_ = w.c.Release(context.Background(), id)
		}
	}
	return false, err
}

func errorsIsRefused(err error) bool { return errors.Is(err, spate.ErrDivisionRefused) }

func pumpRange(t *testing.T, d time.Duration, what string, cond func() bool, ws ...*rangeWorker) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			require.FailNow(t, "timed out waiting for "+what)
		}
		for _, w := range ws {
			w.pump()
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func rangePlan(name string, n int64) spate.SplitPlanner {
	spec := spate.NewSplitSpec(spate.MustSplitID(name), rangeDesc(0, n)).WithWeight(uint64(n))
	return fixedPlanner{fp: "range:" + name, plan: spate.NewSplitPlan([]spate.PlannedSplit{spate.NewPlannedSplit(spec)}, spate.PlanFinal)}
}

// record reads a split's progress record (nil if absent) and its revision.
func record(t *testing.T, s spate.Store, id string) (map[string]json.RawMessage, uint64) {
	t.Helper()
	e, ok, err := s.Get(context.Background(), spate.Durable, "split."+id)
	require.NoError(t, err)
	if !ok {
		return nil, 0
	}
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(e.Value, &m))
	return m, e.Revision
}

// ownRange is the range a split reads now: its record's descriptor after
// a division, else its spec's.
func ownRange(t *testing.T, s spate.Store, id string) (lo, hi int64) {
	t.Helper()
	m, _ := record(t, s, id)
	require.NotNil(t, m, "split %s has a progress record", id)
	if d, ok := m["descriptor"]; ok {
		var b []byte
		require.NoError(t, json.Unmarshal(d, &b))
		return rangeOf(t, b)
	}
	e, ok, err := s.Get(context.Background(), spate.Durable, "spec."+id)
	require.NoError(t, err)
	require.True(t, ok, "split %s has a spec", id)
	var spec struct{ Descriptor []byte }
	require.NoError(t, json.Unmarshal(e.Value, &spec))
	return rangeOf(t, spec.Descriptor)
}

// TestDivideAtEveryPosition is the exhaustive check: a split of n records,
// read and committed up to every position r, divided at every position p.
// The source refuses p < r (read already) and p >= n (nothing to give);
// the coordinator refuses p below the committed watermark even when the
// source asks. An accepted division leaves the parent reading [0, p) and
// a child reading [p, n); every record is published exactly once.
func TestDivideAtEveryPosition(t *testing.T) {
	const n = 5
	for r := int64(0); r <= n; r++ {
		for p := int64(0); p <= n; p++ {
			t.Run(fmt.Sprintf("read%d/at%d", r, p), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) { divideOnce(t, n, r, p) })
			})
		}
	}
}

func divideOnce(t *testing.T, n, r, p int64) {
	s := mem.MustNew(mem.Options{TTL: testLease})
	defer s.Close()
	out := &sink{out: map[int64]int{}}
	a := startRange(t, s, "a", rangePlan("x", n), out)
	a.limit = r
	id := spate.MustSplitID("x")
	pumpRange(t, 20*testLease, "a reading up to its position", func() bool {
		ten := a.held[id]
		return ten != nil && ten.committed == min(r, n-1) || a.done
	}, a)
	if r == n {
		// Everything read: the split completes at once; nothing is left
		// to divide.
		a.limit = 1 << 62
		pumpRange(t, 20*testLease, "AllComplete", func() bool { return a.done }, a)
		out.check(t, n)
		return
	}
	ten := a.held[id]
	require.NotNil(t, ten)
	before, beforeRev := record(t, s, "x")
	if p < ten.read {
		// The coordinator refuses a position below the committed
		// watermark, whatever the source says, and writes nothing.
		_, err := a.c.Divide(context.Background(), id, ten.epoch, spate.Division{Position: p,
			Primary: rangeDesc(0, p), Residual: rangeDesc(p, n)})
		require.Error(t, err)
		assert.True(t, errorsIsRefused(err) && spate.IsRetryable(err), "a division below the watermark is refused: %v", err)
		after, afterRev := record(t, s, "x")
		assert.Equal(t, beforeRev, afterRev, "a refused division writes nothing")
		assert.Equal(t, before, after)
	}
	accepted, err := a.divide(id, p)
	require.NoError(t, err)
	assert.Equal(t, p >= r && p < n, accepted, "the source accepts exactly the positions at or beyond its read position")
	b := startRange(t, s, "b", rangePlan("x", n), out)
	a.limit, b.limit = 1<<62, 1<<62
	pumpRange(t, 40*testLease, "AllComplete on both", func() bool { return a.done && b.done }, a, b)
	out.check(t, n)
	lo, hi := ownRange(t, s, "x")
	assert.Equal(t, int64(0), lo)
	child := spate.ChildSplitID(id, p).String()
	if !accepted {
		assert.Equal(t, n, hi, "a refused division leaves the split whole")
		m, _ := record(t, s, child)
		assert.Nil(t, m, "a refused division creates no child")
		return
	}
	clo, chi := ownRange(t, s, child)
	assert.Equal(t, [2]int64{p, p}, [2]int64{hi, clo}, "the primary ends where the residual starts: disjoint, nothing between")
	assert.Equal(t, n, chi, "the residual runs to the original end")
}

// The owner divides, and is killed or frozen before, during and after the
// division's commit; every record is still published exactly once, and
// the record a zombie's division would have changed is untouched.
func TestDivideWithTheOwnerKilledOrFrozen(t *testing.T) {
	const n, r, p = 8, 2, 5
	id := spate.MustSplitID("x")
	child := spate.ChildSplitID(id, p).String()
	setup := func(t *testing.T) (*mem.Store, *sink, *rangeWorker) {
		s := mem.MustNew(mem.Options{TTL: testLease})
		t.Cleanup(func() { s.Close() })
		out := &sink{out: map[int64]int{}}
		a := startRange(t, s, "a", rangePlan("x", n), out)
		a.limit = r
		pumpRange(t, 20*testLease, "a at its position", func() bool {
			ten := a.held[id]
			return ten != nil && ten.committed == r
		}, a)
		return s, out, a
	}
	finish := func(t *testing.T, s *mem.Store, ws ...*rangeWorker) {
		for _, w := range ws {
			w.limit = 1 << 62
		}
		pumpRange(t, 60*testLease, "AllComplete", func() bool {
			for _, w := range ws {
				if !w.done {
					return false
				}
			}
			return true
		}, ws...)
	}

	t.Run("killed before the division", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, out, a := setup(t)
			require.NoError(t, a.c.Abandon())
			_, err := a.divide(id, p)
			assert.ErrorIs(t, err, spate.ErrClosed, "a dead owner divides nothing")
			b := startRange(t, s, "b", rangePlan("x", n), out)
			finish(t, s, b)
			out.check(t, n)
			lo, hi := ownRange(t, s, "x")
			assert.Equal(t, [2]int64{0, n}, [2]int64{lo, hi}, "undivided")
		})
	})

	t.Run("frozen: a zombie's division writes nothing", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _, a := setup(t)
			ten := a.held[id]
			// Blind the owner, then let a peer seize the split out of band,
			// as after a freeze past the lease: only the division's own
			// compare-and-swap can tell it.
			a.inj.Add(faultstore.Rule{Ops: []faultstore.Op{faultstore.Watch, faultstore.List}})
			a.inj.BreakWatches()
			seize(t, s, "x")
			before, beforeRev := record(t, s, "x")
			_, err := a.c.Divide(context.Background(), id, ten.epoch, spate.Division{Position: p,
				Primary: rangeDesc(0, p), Residual: rangeDesc(p, n)})
			assert.True(t, spate.IsFenced(err), "a zombie's division is Fenced: %v", err)
			after, afterRev := record(t, s, "x")
			assert.Equal(t, beforeRev, afterRev, "a zombie's division writes nothing")
			assert.Equal(t, before, after)
			a.inj.Clear()
			pumpRange(t, 10*testLease, "Lost after the fenced division", func() bool { return a.held[id] == nil }, a)
			m, _ := record(t, s, child)
			assert.Nil(t, m, "no child for a zombie's division")
		})
	})

	t.Run("during: the division lands but its reply is lost", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, out, a := setup(t)
			a.inj.Add(faultstore.Rule{Ops: []faultstore.Op{faultstore.Update}, Keyspace: spate.Durable, KeyPrefix: "split.x",
				Landed: true, Times: 1, Match: func(c faultstore.Call) bool { return bytes.Contains(c.Value, []byte(`"children"`)) }})
			accepted, err := a.divide(id, p)
			require.Error(t, err, "a division whose reply was lost has an unknown outcome")
			assert.False(t, accepted)
			assert.Nil(t, a.held[id], "the owner stops reading a split whose division is in doubt")
			b := startRange(t, s, "b", rangePlan("x", n), out)
			finish(t, s, a, b)
			out.check(t, n)
			lo, hi := ownRange(t, s, "x")
			clo, chi := ownRange(t, s, child)
			assert.Equal(t, [4]int64{0, p, p, n}, [4]int64{lo, hi, clo, chi}, "the division that landed holds")
		})
	})

	t.Run("killed after the division, before the child exists", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, out, a := setup(t)
			// The owner leads; it never gets to create the child.
			a.inj.Add(faultstore.Rule{Ops: []faultstore.Op{faultstore.Create}, Keyspace: spate.Durable, KeyPrefix: "spec." + child})
			accepted, err := a.divide(id, p)
			require.NoError(t, err)
			require.True(t, accepted)
			require.NoError(t, a.c.Abandon())
			m, _ := record(t, s, child)
			require.Nil(t, m, "the child must not exist yet for this case")
			b := startRange(t, s, "b", rangePlan("x", n), out)
			finish(t, s, b)
			out.check(t, n)
			lo, hi := ownRange(t, s, "x")
			clo, chi := ownRange(t, s, child)
			assert.Equal(t, [4]int64{0, p, p, n}, [4]int64{lo, hi, clo, chi}, "the next leader created the child from the parent's record")
		})
	})

	t.Run("frozen after the division", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, out, a := setup(t)
			accepted, err := a.divide(id, p)
			require.NoError(t, err)
			require.True(t, accepted)
			// The owner stops and is cut off from the store past its lease;
			// a peer finishes both halves; then the owner thaws.
			a.frozen = true
			a.inj.Partition()
			b := startRange(t, s, "b", rangePlan("x", n), out)
			finish(t, s, b)
			a.inj.Heal()
			a.frozen = false
			for range 20 {
				a.pump() // a thawed zombie publishes nothing more
				time.Sleep(testLease / 10)
			}
			out.check(t, n)
		})
	})
}

// seize takes split id's lease and record out of band for a thief.
func seize(t *testing.T, s spate.Store, id string) {
	ctx := context.Background()
	for _, ks := range []spate.Keyspace{spate.Ephemeral, spate.Durable} {
		e, ok, err := s.Get(ctx, ks, "split."+id)
		require.NoError(t, err)
		require.True(t, ok)
		var m map[string]any
		dec := json.NewDecoder(bytes.NewReader(e.Value))
		dec.UseNumber()
		require.NoError(t, dec.Decode(&m))
		ep, _ := m["epoch"].(json.Number).Int64()
		m["owner"], m["epoch"] = "thief", ep+1
		if ks == spate.Ephemeral {
			m["nonce"] = "thief-nonce"
		}
		b, err := json.Marshal(m)
		require.NoError(t, err)
		o, err := s.Update(ctx, ks, "split."+id, b, e.Revision)
		require.NoError(t, err)
		require.True(t, o.Won)
	}
}
