package spate_test

import (
	"bytes"
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/mem"
)

// counting is the obvious store decorator: it embeds spate.Store and
// overrides Get.
type counting struct {
	spate.Store
	gets *atomic.Int64
}

func (c counting) Get(ctx context.Context, ks spate.Keyspace, key string) (spate.Entry, bool, error) {
	c.gets.Add(1)
	return c.Store.Get(ctx, ks, key)
}

// Embedding hides the inner store's optional methods while its
// Capabilities still claim them: the coordinator says so at construction,
// naming the capability, the cost and the fix. Decorate keeps them, and
// the wrapper's own methods still run.
func TestDecorateKeepsCapabilitiesAndTheCoordinatorWarnsWithout(t *testing.T) {
	inner := mem.MustNew(mem.Options{TTL: 2 * time.Second})
	defer inner.Close()
	_, hasKW := spate.KeyWatcherOf(inner)
	_, hasS := spate.SessionerOf(inner)
	require.True(t, hasKW && hasS, "the in-memory store has both capabilities")

	var gets atomic.Int64
	naive := counting{Store: inner, gets: &gets}
	_, kw := spate.KeyWatcherOf(naive)
	require.False(t, kw, "embedding hides WatchKeys")
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	_, err := spate.NewStoreCoordinator(naive, spate.TimingsForLease(2*time.Second), spate.WithLogger(log))
	require.NoError(t, err)
	assert.Contains(t, logs.String(), "capability=WatchKeys")
	assert.Contains(t, logs.String(), "every worker watches the whole job")
	assert.Contains(t, logs.String(), "capability=Sessions")
	assert.Contains(t, logs.String(), "spate.Decorate(inner, wrapper)")

	st := spate.Decorate(inner, naive)
	_, kw = spate.KeyWatcherOf(st)
	_, s := spate.SessionerOf(st)
	assert.True(t, kw && s, "Decorate passes the capabilities through")
	logs.Reset()
	_, err = spate.NewStoreCoordinator(st, spate.TimingsForLease(2*time.Second), spate.WithLogger(log))
	require.NoError(t, err)
	assert.Empty(t, logs.String(), "a decorated store loses nothing to warn about")
	_, _, err = st.Get(t.Context(), spate.Durable, "k")
	require.NoError(t, err)
	assert.Equal(t, int64(1), gets.Load(), "the wrapper's own method runs")

	w, _ := spate.KeyWatcherOf(st)
	ch, err := w.WatchKeys(t.Context(), spate.Durable, []string{"k"})
	require.NoError(t, err)
	require.NotNil(t, ch)
}
