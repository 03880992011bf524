package spate_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/mem"
)

// rotatingPlanner is a followed directory's planner in miniature: three
// applications whose log rotates, each rotation a new file (a new split)
// and the old one deleted. Plan plans the live files; Prune returns the
// completed splits whose file was deleted and whose completion is older
// than the retention.
type rotatingPlanner struct {
	retain time.Duration

	mu      sync.Mutex
	live    map[string]bool
	deleted map[string]bool
	next    int
	born    map[string]time.Time
	offered map[string]int // how often Prune was offered a split
}

func (p *rotatingPlanner) Fingerprint() string { return "rotating" }

func (p *rotatingPlanner) Plan(context.Context, spate.PlanContext) (spate.SplitPlan, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ss []spate.PlannedSplit
	for id := range p.live {
		ss = append(ss, spate.NewPlannedSplit(spate.NewSplitSpec(spate.MustSplitID(id), []byte("file "+id))))
	}
	return spate.NewSplitPlan(ss, spate.PlanOpen), nil
}

func (p *rotatingPlanner) Prune(_ context.Context, done []spate.DoneSplit) ([]spate.SplitID, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []spate.SplitID
	for _, d := range done {
		id := d.Spec.ID.String()
		p.offered[id]++
		if p.live[id] {
			panic("a planned split was offered for pruning: " + id)
		}
		if p.deleted[id] && time.Since(d.CompletedAt) >= p.retain && string(d.Spec.Descriptor) == "file "+id {
			out = append(out, d.Spec.ID)
		}
	}
	return out, nil
}

// rotate replaces one live file with a new one: the old is deleted.
func (p *rotatingPlanner) rotate(old string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next++
	id := fmt.Sprintf("f%03d", p.next)
	p.live[id] = true
	p.born[id] = time.Now()
	if old != "" {
		delete(p.live, old)
		p.deleted[old] = true
	}
	return id
}

func (p *rotatingPlanner) isDeleted(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.deleted[id]
}

// pruneWorker holds the splits it is given and completes a split once its
// file is deleted, as a tail lane does. It counts every gain.
type pruneWorker struct {
	id   string
	c    *spate.StoreCoordinator
	held map[spate.SplitID]spate.LeaseEpoch
	gone bool
}

// An open plan of files that rotate (100 files over 100 minutes, three
// workers, the leader killed midway) keeps in the store only the live
// files' splits and those completed within the retention: the leader
// prunes a completed split once its planner says its file is gone and the
// retention has passed; never a live one, never one completed less than
// the retention ago. A pruned split is never gained again (its work is
// never shipped twice), no view restores it, and no assignment names it.
func TestAnOpenPlanPrunesCompletedSplitsWhoseWorkIsGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := spate.Config{}.WithDefaults()
		s := mem.MustNew(mem.Options{TTL: cfg.LeaseDuration})
		defer s.Close()
		const retain = 10 * time.Minute
		p := &rotatingPlanner{retain: retain, live: map[string]bool{}, deleted: map[string]bool{}, born: map[string]time.Time{}, offered: map[string]int{}}
		apps := []string{p.rotate(""), p.rotate(""), p.rotate("")}
		var logs strings.Builder
		var logMu sync.Mutex
		start := func(id string) *pruneWorker {
			h, err := s.Connect()
			require.NoError(t, err)
			t.Cleanup(func() { _ = h.Close() })
			c := cfg
			c.InstanceID = id
			co, err := spate.NewStoreCoordinator(h, c, spate.WithLogger(slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, &slog.HandlerOptions{Level: slog.LevelInfo}))))
			require.NoError(t, err)
			require.NoError(t, co.Start(p))
			t.Cleanup(func() { _ = co.Close() })
			return &pruneWorker{id: id, c: co, held: map[spate.SplitID]spate.LeaseEpoch{}}
		}
		gains := map[string]int{}
		completedAt := map[string]time.Time{}
		pump := func(w *pruneWorker) {
			if w.gone {
				return
			}
			evs, err := w.c.Poll()
			require.NoError(t, err, w.id)
			for _, ev := range evs {
				switch e := ev.(type) {
				case spate.Gained:
					id := e.Split.ID.String()
					require.True(t, e.Progress == nil || !e.Progress.Completed, "split %s gained completed", id)
					_, done := completedAt[id]
					require.False(t, done, "split %s gained again after it completed: its work would ship twice", id)
					gains[id]++
					w.held[e.Split.ID] = e.Epoch
				case spate.Lost:
					delete(w.held, e.Split)
				case spate.RevokeRequested:
					if ep, ok := w.held[e.Split]; ok {
						if w.c.CommitAt(context.Background(), e.Split, ep, spate.NewSplitProgress(1, nil)) == nil {
							_ = w.c.ReleaseDrained(context.Background(), e.Split)
						}
						delete(w.held, e.Split)
					}
				}
			}
			for id, ep := range w.held {
				if !p.isDeleted(id.String()) {
					continue
				}
				if w.c.CommitAt(context.Background(), id, ep, spate.CompletedProgress(10, nil)) == nil {
					_, dup := completedAt[id.String()]
					require.False(t, dup, "split %s completed twice", id)
					completedAt[id.String()] = time.Now()
				}
				delete(w.held, id)
			}
		}
		all := func(ks spate.Keyspace, prefix string) map[string]bool {
			es, err := s.List(context.Background(), ks, prefix)
			require.NoError(t, err)
			out := map[string]bool{}
			for _, e := range es {
				out[strings.TrimPrefix(e.Key, prefix)] = true
			}
			return out
		}
		// check: the store holds the live files' splits and those
		// completed within the retention (and a replan or two more), no
		// other; no assignment names a pruned split. It returns the
		// split records and how many are kept within the retention.
		check := func() (records, kept int) {
			now := time.Now()
			splits, specs := all(spate.Durable, "split."), all(spate.Durable, "spec.")
			p.mu.Lock()
			defer p.mu.Unlock()
			for id := range p.live {
				if now.Sub(p.born[id]) > 2*cfg.ReplanInterval {
					assert.True(t, splits[id] && specs[id], "live split %s was pruned", id)
				}
			}
			for id, at := range completedAt {
				switch age := now.Sub(at); {
				case age < retain:
					assert.True(t, splits[id], "split %s completed %v ago (within the retention) was pruned", id, age)
					kept++
				case age > retain+2*cfg.ReplanInterval:
					assert.False(t, splits[id] || specs[id], "split %s completed %v ago, its file gone, is still in the store", id, age)
				}
			}
			assert.LessOrEqual(t, len(splits), len(p.live)+kept+3, "split records: live %d, within the retention %d", len(p.live), kept)
			assert.Equal(t, len(splits), len(specs), "a spec without its progress record, or the reverse")
			assign, err := s.List(context.Background(), spate.Durable, "assign.")
			require.NoError(t, err)
			for _, e := range assign {
				for id := range p.deleted {
					if !splits[id] {
						assert.NotContains(t, string(e.Value), `"`+id+`"`, "the assignment %s names a pruned split", e.Key)
					}
				}
			}
			return len(splits), kept
		}
		ws := []*pruneWorker{start("a"), start("b"), start("c")}
		begin := time.Now()
		killed, checked := false, false
		for n := 0; len(completedAt) < 97 || time.Since(begin) < 100*time.Minute; n++ {
			elapsed := time.Since(begin)
			if rot := int(elapsed / time.Minute); rot >= 1 && rot <= 97 && p.next < rot+3 {
				i := rot % len(apps)
				apps[i] = p.rotate(apps[i])
			}
			if !killed && elapsed > 50*time.Minute {
				killed = true
				js, err := spate.InspectJob(context.Background(), s, "")
				require.NoError(t, err)
				require.NotNil(t, js.Leader)
				for _, w := range ws {
					if w.id == js.Leader.Instance {
						require.NoError(t, w.c.Abandon()) // the leader dies: its successor prunes
						w.gone = true
					}
				}
				ws = append(ws, start("d"))
			}
			for _, w := range ws {
				pump(w)
			}
			if !checked && elapsed > 80*time.Minute {
				checked = true
				records, kept := check()
				require.Greater(t, kept, 5, "splits completed within the retention at 80 minutes")
				t.Logf("at 80 minutes, 80 files rotated: %d split records (3 live, %d completed within %v)", records, kept, retain)
			}
			if elapsed >= 3*time.Hour {
				js, _ := spate.InspectJob(context.Background(), s, "")
				for _, sp := range js.Splits {
					if _, ok := completedAt[sp.ID.String()]; !ok {
						t.Logf("%s %s owner=%q lease=%q deleted=%v", sp.ID, sp.Status, sp.Owner, sp.LeaseOwner, p.isDeleted(sp.ID.String()))
					}
				}
				t.Logf("assign %v", js.Assignments)
				for id := range p.deleted {
					if _, ok := completedAt[id]; !ok {
						t.Logf("not completed: %s", id)
					}
				}
				t.Fatalf("the rotations did not complete: %d of 97 files completed", len(completedAt))
			}
			time.Sleep(time.Second)
		}
		require.True(t, killed && checked)
		// A retention and two replans more: every split deleted long
		// enough ago is pruned.
		for end := time.Now().Add(retain + 3*cfg.ReplanInterval); time.Now().Before(end); {
			for _, w := range ws {
				pump(w)
			}
			time.Sleep(time.Second)
		}
		synctest.Wait()
		records, kept := check()
		p.mu.Lock()
		require.Equal(t, 100, p.next, "files planned")
		offers := len(p.offered)
		p.mu.Unlock()

		for id, n := range gains {
			assert.LessOrEqual(t, n, 3, "split %s gained %d times", id, n)
		}
		logMu.Lock()
		defer logMu.Unlock()
		assert.NotContains(t, logs.String(), "restored a deleted progress record", "a view restored a pruned split")
		assert.Contains(t, logs.String(), "pruned completed splits whose work is gone")
		t.Logf("100 files over %v: %d split records at the end (%d completed within %v); splits offered to Prune: %d",
			time.Since(begin).Round(time.Minute), records, kept, retain, offers)
	})
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(b)
}
