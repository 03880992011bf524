package casload_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/internal/casload"
	"github.com/spate-go/spate/stores/mem"
)

// recorder is a testing.TB that keeps what the load reports.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recorder) reported() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.errs...)
}

// lossy wins every other update without writing it: the increment is
// acknowledged and lost, as a store that broke fencing would.
type lossy struct {
	spate.Store
	n atomic.Int64
}

func (s *lossy) Update(ctx context.Context, ks spate.Keyspace, key string, v []byte, rev uint64) (spate.Outcome, error) {
	if s.n.Add(1)%2 == 0 {
		e, ok, err := s.Store.Get(ctx, ks, key)
		if err != nil || !ok || e.Revision != rev {
			return s.Store.Update(ctx, ks, key, v, rev)
		}
		return s.Store.Update(ctx, ks, key, e.Value, rev)
	}
	return s.Store.Update(ctx, ks, key, v, rev)
}

func counter(t *testing.T, st spate.Store) int {
	t.Helper()
	e, ok, err := st.Get(t.Context(), spate.Durable, casload.Key)
	require.NoError(t, err)
	require.True(t, ok)
	v, err := strconv.Atoi(string(e.Value))
	require.NoError(t, err)
	return v
}

func run(t *testing.T, tb testing.TB, st spate.Store, rec *conformance.History) *casload.Load {
	o, err := conformance.Recorder{H: rec, Client: 0, Store: st}.Create(t.Context(), spate.Durable, casload.Key, []byte("0"))
	require.NoError(t, err)
	require.True(t, o.Won)
	l := casload.Start(tb, t.Context(), rec, []spate.Store{st, st, st})
	l.WaitWon(60, 10*time.Second, "the load")
	l.Stop()
	return l
}

// On a store that keeps its promises the clients' history is
// linearizable and the counter holds exactly the won increments.
func TestLoadOnASoundStore(t *testing.T) {
	st, err := mem.New(mem.Options{TTL: time.Second})
	require.NoError(t, err)
	defer st.Close()
	rec := &conformance.History{}
	tb := &recorder{TB: t}
	l := run(t, tb, st, rec)
	assert.GreaterOrEqual(t, l.Won(), int64(60))
	assert.Zero(t, l.Unknown(), "no call failed")
	l.CheckFinal(counter(t, st))
	assert.Empty(t, tb.reported())
	ok, info := rec.Check(time.Minute)
	assert.True(t, ok, info)
	assert.NotZero(t, l.FirstWinAfter(time.Time{}), "the first win is timed")
}

// On a store that acknowledges increments it drops, CheckFinal reports the
// lost ones, and the history is not linearizable.
func TestLoadCatchesLostIncrements(t *testing.T) {
	inner, err := mem.New(mem.Options{TTL: time.Second})
	require.NoError(t, err)
	defer inner.Close()
	st := &lossy{Store: inner}
	rec := &conformance.History{}
	tb := &recorder{TB: t}
	l := run(t, tb, st, rec)
	l.CheckFinal(counter(t, inner))
	errs := tb.reported()
	require.Len(t, errs, 1, "%q", errs)
	assert.Contains(t, errs[0], "no won increment is lost")
	ok, _ := rec.Check(time.Minute)
	assert.False(t, ok, "a history with lost acknowledged increments is not linearizable")
}
