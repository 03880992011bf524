package spate_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/jobfollow"
	"github.com/spate-go/spate/stores/mem"
)

// flat is a SplitState with its damage as text, for comparing two reads.
type flat struct {
	spate.SplitState
	Progress *spate.SplitProgress
	Damage   string
}

func flatten(js *spate.JobState) []flat {
	out := make([]flat, 0, len(js.Splits))
	for _, s := range js.Splits {
		f := flat{SplitState: s, Progress: s.Progress}
		if s.Damage != nil {
			f.Damage = s.Damage.Error()
		}
		f.SplitState.Damage, f.SplitState.Progress = nil, nil
		out = append(out, f)
	}
	return out
}

// startRangeWorker starts worker w-1 of rangePlanner's job on st.
func startRangeWorker(t *testing.T, st spate.Store, waker spate.Waker) *spate.StoreCoordinator {
	t.Helper()
	cfg := spate.TimingsForLease(time.Second)
	cfg.InstanceID = "w-1"
	c, err := spate.NewStoreCoordinator(st, cfg, spate.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	c.SetWaker(waker)
	require.NoError(t, c.Start(rangePlanner{}))
	return c
}

// follow feeds f from watches of both keyspaces of st until ctx ends;
// each event is applied under mu.
func follow(ctx context.Context, t *testing.T, st spate.Store, f jobfollow.Follower, mu *sync.Mutex) {
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		ch, err := st.Watch(ctx, ks, "")
		require.NoError(t, err)
		go func() {
			for ev := range ch {
				mu.Lock()
				_, _ = f.Apply(ks, ev)
				mu.Unlock()
			}
		}()
	}
}

// A follower fed by the job's watches holds what InspectJob reads, split
// for split, while a worker gains, commits part, completes, is fenced by
// a quarantine and leaves, and after records are damaged under it.
func TestJobFollowerMatchesInspectJob(t *testing.T) {
	st := mem.MustNew(mem.Options{TTL: time.Second})
	defer st.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	f := jobfollow.New("")
	var mu sync.Mutex
	follow(ctx, t, st, f, &mu)

	c := startRangeWorker(t, st, spate.NewWaker())
	same := func(what string) {
		t.Helper()
		var last string
		require.Eventually(t, func() bool {
			want, err := spate.InspectJob(ctx, st, "")
			if err != nil {
				last = err.Error()
				return false
			}
			mu.Lock()
			got, err := f.State()
			mu.Unlock()
			if err != nil {
				last = err.Error()
				return false
			}
			if !assert.ObjectsAreEqual(flatten(want), flatten(got)) || !assert.ObjectsAreEqual(want.Plan, got.Plan) ||
				!assert.ObjectsAreEqual(want.Members, got.Members) || !assert.ObjectsAreEqual(want.Leader, got.Leader) ||
				!assert.ObjectsAreEqual(want.Assignments, got.Assignments) {
				last = fmt.Sprintf("InspectJob:\n%+v\nfollower:\n%+v", flatten(want), flatten(got))
				return false
			}
			return len(want.Splits) > 0
		}, 10*time.Second, 20*time.Millisecond, "%s: the follower never matched InspectJob: %s", what, last)
	}

	// Gain every split, commit half of each, complete all but one.
	gained := map[string]bool{}
	var keep spate.SplitID
	require.Eventually(t, func() bool {
		evs, err := c.Poll()
		require.NoError(t, err)
		for _, ev := range evs {
			if g, ok := ev.(spate.Gained); ok {
				id := g.Split.ID
				require.NoError(t, c.Commit(ctx, id, spate.SplitProgress{Watermark: 50}))
				if len(gained) == 0 {
					keep = id
				} else {
					require.NoError(t, c.Commit(ctx, id, spate.CompletedProgress(100, nil)))
				}
				gained[id.String()] = true
			}
		}
		return len(gained) == 6
	}, 10*time.Second, 10*time.Millisecond)
	same("after commits and completions")

	// A split record damaged under the job, and an alien spec.
	js, err := spate.InspectJob(ctx, st, "")
	require.NoError(t, err)
	var victim spate.SplitState
	for _, s := range js.Splits {
		if s.ID != keep {
			victim = s
			break
		}
	}
	_, err = st.Update(ctx, spate.Durable, "split."+victim.ID.String(), []byte(`{"not":"a record"}`), victim.Revision)
	require.NoError(t, err)
	e, ok, err := st.Get(ctx, spate.Durable, "spec."+keep.String())
	require.NoError(t, err)
	require.True(t, ok)
	_, err = st.Update(ctx, spate.Durable, "spec."+keep.String(), []byte(`<script>`), e.Revision)
	require.NoError(t, err)
	same("after damage")
	mu.Lock()
	d, ok := f.Split(victim.ID.String())
	mu.Unlock()
	require.True(t, ok)
	assert.Equal(t, spate.StatusDamaged, d.Status)
	assert.ErrorIs(t, d.Damage, spate.ErrUnreadableRecord)

	// The worker leaves: its presence and leases go, the follower agrees.
	require.NoError(t, c.Close())
	same("after the worker left")
	mu.Lock()
	meta, err := f.Meta()
	mu.Unlock()
	require.NoError(t, err)
	assert.Empty(t, meta.Members)
}

// Records applied before the plan are read once it arrives; a plan of
// another fingerprint and a deleted plan fail as InspectJob does.
func TestJobFollowerReadsSplitsOnceThePlanArrives(t *testing.T) {
	st := mem.MustNew(mem.Options{TTL: time.Second})
	defer st.Close()
	c := startRangeWorker(t, st, spate.InertWaker())
	require.Eventually(t, func() bool {
		js, err := spate.InspectJob(t.Context(), st, "")
		return err == nil && len(js.Splits) == 6
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, c.Close())

	dur, err := st.List(t.Context(), spate.Durable, "")
	require.NoError(t, err)
	var plan spate.Entry
	f := jobfollow.New("")
	for _, e := range dur {
		if e.Key == "plan" {
			plan = e
			continue
		}
		touched, err := f.Apply(spate.Durable, spate.WatchEvent{Kind: spate.WatchPut, Key: e.Key, Value: e.Value, Revision: e.Revision})
		require.NoError(t, err)
		assert.NotEmpty(t, touched.Split, "record %s touched no split", e.Key)
	}
	_, err = f.State()
	require.ErrorIs(t, err, spate.ErrNoJob)
	touched, err := f.Apply(spate.Durable, spate.WatchEvent{Kind: spate.WatchPut, Key: plan.Key, Value: plan.Value, Revision: plan.Revision})
	require.NoError(t, err)
	assert.True(t, touched.Job)
	js, err := f.State()
	require.NoError(t, err)
	require.Len(t, js.Splits, 6)
	for _, s := range js.Splits {
		assert.Equal(t, spate.StatusRunnable, s.Status, "split %s", s.ID)
		assert.True(t, s.HasSpec)
	}

	other := jobfollow.New("another:fingerprint")
	_, err = other.Apply(spate.Durable, spate.WatchEvent{Kind: spate.WatchPut, Key: plan.Key, Value: plan.Value, Revision: plan.Revision})
	require.Error(t, err)
	_, err = other.State()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "fingerprint mismatch")

	_, err = f.Apply(spate.Durable, spate.WatchEvent{Kind: spate.WatchDelete, Key: plan.Key, Revision: plan.Revision + 100})
	require.NoError(t, err)
	_, err = f.State()
	require.ErrorIs(t, err, spate.ErrNoJob)
}

// A follower keeps a job's state from a watch of its records: the
// snapshot first (here decoded at once, deferred), then each change. A
// worker plans the job and leaves; the follower reads it from the durable
// keyspace's watch. (This was ExampleJobFollower while the follower was
// in the root's API.)
func TestJobFollowerFoldsADeferredSnapshot(t *testing.T) {
	store := mem.MustNew(mem.Options{TTL: time.Second})
	defer store.Close()
	cfg := spate.TimingsForLease(time.Second)
	cfg.InstanceID = "worker-0"
	c, err := spate.NewStoreCoordinator(store, cfg, spate.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	c.SetWaker(spate.InertWaker())
	require.NoError(t, c.Start(rangePlanner{}))
	require.Eventually(t, func() bool { // the plan's six splits
		js, err := spate.InspectJob(context.Background(), store, "")
		return err == nil && len(js.Splits) == 6
	}, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, c.Close())

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := store.Watch(ctx, spate.Durable, "")
	require.NoError(t, err)
	f := jobfollow.New("example:ids:v1")
	f.Defer() // decode the snapshot on every core at once
	for ev := range events {
		if ev.Kind == spate.WatchSnapshotDone {
			break
		}
		_, err := f.Apply(spate.Durable, ev)
		require.NoError(t, err)
	}
	require.NoError(t, f.Decode())
	js, err := f.State()
	require.NoError(t, err)
	assert.Equal(t, "final", fmt.Sprint(js.Plan.Finality))
	assert.EqualValues(t, 6, js.Plan.Planned)
	s, ok := f.Split("ids-200-300")
	require.True(t, ok)
	assert.Equal(t, "ids-200-300", s.ID.String())
	assert.Equal(t, "runnable", fmt.Sprint(s.Status))
	assert.EqualValues(t, 1, s.Weight)
	assert.EqualValues(t, 0, s.Attempts)
}
