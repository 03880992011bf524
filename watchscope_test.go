package spate_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/mem"
)

// watchLog is one worker's store, recording what its watches asked for and
// the live events they delivered.
type watchLog struct {
	spate.Store
	mu       sync.Mutex
	prefixes int             // whole-keyspace (prefix) watches opened
	keys     map[string]bool // every key a key watch asked for
	events   map[string]int  // live events delivered, by key
}

func newWatchLog(s spate.Store) *watchLog {
	return &watchLog{Store: s, keys: map[string]bool{}, events: map[string]int{}}
}

func (w *watchLog) Capabilities() spate.Capabilities {
	c := w.Store.Capabilities()
	_, c.WatchKeys = spate.KeyWatcherOf(w.Store)
	return c
}

func (w *watchLog) Watch(ctx context.Context, ks spate.Keyspace, prefix string) (<-chan spate.WatchEvent, error) {
	w.mu.Lock()
	w.prefixes++
	w.mu.Unlock()
	in, err := w.Store.Watch(ctx, ks, prefix)
	return w.count(ctx, in, err)
}

func (w *watchLog) WatchKeys(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
	kw, ok := spate.KeyWatcherOf(w.Store)
	if !ok {
		return nil, fmt.Errorf("no KeyWatcher: %w", spate.ErrFatal)
	}
	w.mu.Lock()
	for _, k := range keys {
		w.keys[ks.String()+"/"+k] = true
	}
	w.mu.Unlock()
	in, err := kw.WatchKeys(ctx, ks, keys)
	return w.count(ctx, in, err)
}

func (w *watchLog) count(ctx context.Context, in <-chan spate.WatchEvent, err error) (<-chan spate.WatchEvent, error) {
	if err != nil {
		return nil, err
	}
	out := make(chan spate.WatchEvent)
	go func() {
		defer close(out)
		live := false
		for ev := range in {
			switch ev.Kind {
			case spate.WatchSnapshotDone:
				live = true
			case spate.WatchPut, spate.WatchDelete:
				if live {
					w.mu.Lock()
					w.events[ev.Key]++
					w.mu.Unlock()
				}
			}
			select {
			case out <- ev:
			case <-ctx.Done():
				for range in {
				}
				return
			}
		}
	}()
	return out, nil
}

func (w *watchLog) snapshot() (prefixes int, keys map[string]bool, events int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	keys = map[string]bool{}
	for k := range w.keys {
		keys[k] = true
	}
	for _, n := range w.events {
		events += n
	}
	return w.prefixes, keys, events
}

// On a store with KeyWatcher a worker that does not lead watches only its
// own keys: the leader key, its presence, the plan, its assignment, the
// verdict and the keys of the splits it was assigned or held; the leader
// watches the whole job. When the leader dies, its successor watches the
// whole job, and the job's verdict reaches every worker through the
// verdict record.
func TestANonLeaderWatchesOnlyItsOwnKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := mem.MustNew(mem.Options{TTL: testLease})
		defer s.Close()
		var splits []spate.PlannedSplit
		for i := range 30 {
			splits = append(splits, spate.NewPlannedSplit(spate.NewSplitSpec(spate.MustSplitID(fmt.Sprintf("sc-%02d", i)), nil)))
		}
		p := fixedPlanner{fp: "test:scope", plan: spate.NewSplitPlan(splits, spate.PlanFinal)}
		quiet := slog.New(slog.DiscardHandler)
		logs := map[string]*watchLog{}
		ws := map[string]*tw{}
		for _, id := range []string{"a", "b", "c"} {
			c, err := s.Connect()
			require.NoError(t, err)
			logs[id] = newWatchLog(c)
			cfg := testCfg(id)
			cfg.MaxInFlight = 30
			ws[id] = startTWWith(t, logs[id], cfg, p, quiet)
		}
		all := []*tw{ws["a"], ws["b"], ws["c"]}
		pumpUntil(t, 40*testLease, "every split held, each worker holding some", func() bool {
			n := 0
			for _, w := range all {
				if len(w.held) == 0 {
					return false
				}
				n += len(w.held)
			}
			return n == 30
		}, all...)

		leader := ""
		for id, l := range logs {
			if prefixes, _, _ := l.snapshot(); prefixes > 0 {
				require.Empty(t, leader, "two workers watch the whole job")
				leader = id
			}
		}
		require.NotEmpty(t, leader, "the leader watches the whole job")
		for id, l := range logs {
			if id == leader {
				continue
			}
			_, keys, _ := l.snapshot()
			for k := range keys {
				_, key, _ := strings.Cut(k, "/")
				switch {
				case key == "leader", key == "plan", key == "verdict", key == "worker."+id, key == "assign."+id:
				case strings.HasPrefix(key, "split.") || strings.HasPrefix(key, "spec."):
				default:
					t.Errorf("worker %s watched %q, which is not one of its keys", id, k)
				}
			}
			held := 0
			for sp := range ws[id].held {
				held++
				assert.True(t, keys["durable/split."+sp.String()], "worker %s holds %s but does not watch its progress record", id, sp)
				assert.True(t, keys["ephemeral/split."+sp.String()], "worker %s holds %s but does not watch its lease", id, sp)
			}
			assert.Less(t, len(keys), 5+3*30, "worker %s watches every key of the job", id)
			t.Logf("worker %s: holds %d splits, watched %d keys", id, held, len(keys))
		}

		// Commits on the leader's splits reach the leader, not the others.
		before := map[string]int{}
		for id, l := range logs {
			_, _, before[id] = l.snapshot()
		}
		for sp := range ws[leader].held {
			for i := range 5 {
				require.NoError(t, ws[leader].c.Commit(context.Background(), sp, spate.NewSplitProgress(int64(i+1), nil)))
			}
		}
		commits := 5 * len(ws[leader].held)
		pumpUntil(t, 10*testLease, "the leader's commits reaching its watch", func() bool {
			_, _, after := logs[leader].snapshot()
			return after-before[leader] >= commits
		}, all...)
		for id, l := range logs {
			if id != leader {
				_, _, after := l.snapshot()
				assert.Less(t, after-before[id], commits/2, "worker %s received the leader's commits", id)
				t.Logf("worker %s: %d live events while the leader made %d commits", id, after-before[id], commits)
			}
		}

		// The leader goes: a survivor takes over and watches the whole job.
		require.NoError(t, ws[leader].c.Close())
		var rest []*tw
		for id, w := range ws {
			if id != leader {
				rest = append(rest, w)
			}
		}
		pumpUntil(t, 40*testLease, "a new leader watching the whole job", func() bool {
			for id, l := range logs {
				if prefixes, _, _ := l.snapshot(); id != leader && prefixes > 0 {
					return true
				}
			}
			return false
		}, rest...)

		// Everyone finishes: every worker commits its splits complete, and
		// both survivors see AllComplete, the one that does not lead
		// through the verdict record.
		done := func() bool {
			for _, w := range rest {
				for sp := range w.held {
					_ = w.c.Commit(context.Background(), sp, spate.CompletedProgress(100, nil))
				}
			}
			for _, w := range rest {
				seen := false
				for _, ev := range w.events {
					if _, ok := ev.(spate.AllComplete); ok {
						seen = true
					}
				}
				if !seen {
					return false
				}
			}
			return true
		}
		pumpUntil(t, 60*testLease, "AllComplete on both survivors", done, rest...)
		e, ok, err := logs["a"].Get(context.Background(), spate.Durable, "verdict")
		require.NoError(t, err)
		require.True(t, ok, "the leader recorded its verdict")
		assert.Contains(t, string(e.Value), `"verdict":"complete"`)
	})
}
