package spate_test

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/mem"
)

// The division trigger (docs/decisions/043), on one split of n records
// read one record per pump, committed at each: with workers idle and
// nothing waiting for a lane, the leader asks the owner to divide it, and
// the residuals are read by the idle workers; with no idle lane nothing is
// asked. Every record is published exactly once either way.
func TestAnIdleFleetAsksTheOwnerToDivide(t *testing.T) {
	const n = 400
	children := func(t *testing.T, s spate.Store) (ids []string) {
		t.Helper()
		entries, err := s.List(context.Background(), spate.Durable, "split.")
		require.NoError(t, err)
		for _, e := range entries {
			if strings.Contains(e.Key, "_d") {
				ids = append(ids, e.Key)
			}
		}
		return ids
	}
	cfg := func(id string) spate.Config {
		c := testCfg(id)
		c.MaxInFlight = 1
		return c
	}
	t.Run("three workers", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := mem.MustNew(mem.Options{TTL: testLease})
			defer s.Close()
			out := &sink{out: map[int64]int{}}
			var ws []*rangeWorker
			for _, id := range []string{"a", "b", "c"} {
				w := startRangeWith(t, s, cfg(id), rangePlan("x", n), out)
				w.auto = true
				ws = append(ws, w)
			}
			pumpRange(t, 200*testLease, "AllComplete on every worker", func() bool {
				return ws[0].done && ws[1].done && ws[2].done
			}, ws...)
			out.check(t, n)
			kids := children(t, s)
			var readers, asked int
			for _, w := range ws {
				asked += w.asked
				if w.published > 0 {
					readers++
				}
			}
			t.Logf("children %v, asks %d, published by worker: %d %d %d", kids, asked, ws[0].published, ws[1].published, ws[2].published)
			assert.NotEmpty(t, kids, "the split was never divided")
			assert.Equal(t, 3, readers, "every worker read part of the one split")
			// Bounded: every division answered one ask.
			assert.LessOrEqual(t, len(kids), asked)
			// A division is worth it only while more than divideWorth (1)
			// commit interval (one pump) is left: far fewer than n/4
			// pieces.
			assert.Less(t, len(kids), n/8, "a division storm")
			// The job's weights still add up to the input: a divided
			// split shows what it kept, its children the rest.
			js, err := spate.InspectJob(context.Background(), s, "")
			require.NoError(t, err)
			var total uint64
			for _, sp := range js.Splits {
				total += sp.Weight
			}
			assert.EqualValues(t, n, total, "the splits' weights (%d splits)", len(js.Splits))
		})
	})
	t.Run("one worker", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := mem.MustNew(mem.Options{TTL: testLease})
			defer s.Close()
			out := &sink{out: map[int64]int{}}
			w := startRangeWith(t, s, cfg("a"), rangePlan("x", n), out)
			w.auto = true
			pumpRange(t, 200*testLease, "AllComplete", func() bool { return w.done }, w)
			out.check(t, n)
			assert.Zero(t, w.asked, "asked to divide with no lane free in the fleet")
			assert.Empty(t, children(t, s))
		})
	})
}
