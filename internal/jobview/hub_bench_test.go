package jobview

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/jobfollow"
	"github.com/spate-go/spate/stores/mem"
)

// benchPlanner plans n splits of 1 MiB.
type benchPlanner struct{ n int }

func (p benchPlanner) Fingerprint() string { return fmt.Sprintf("bench:%d", p.n) }

func (p benchPlanner) Plan(context.Context, spate.PlanContext) (spate.SplitPlan, error) {
	ss := make([]spate.PlannedSplit, 0, p.n)
	for i := range p.n {
		id := spate.MustSplitID(fmt.Sprintf("s-%06d", i))
		ss = append(ss, spate.NewPlannedSplit(spate.NewSplitSpec(id, nil).WithWeight(1<<20)))
	}
	return spate.NewSplitPlan(ss, spate.PlanFinal), nil
}

// benchJob is a job of n splits, seeded by a real coordinator, with a
// worker holding 8 of them; commits are the successive progress records
// of one held split, written by that worker.
type benchJob struct {
	st       *mem.Store // the job's store, kept open
	dur, eph []spate.Entry
	split    string
	commits  []spate.Entry // one split's progress record after each commit
}

var (
	benchMu   sync.Mutex
	benchJobs = map[int]*benchJob{}
)

func seedJob(b *testing.B, n int) *benchJob {
	benchMu.Lock()
	defer benchMu.Unlock()
	if j := benchJobs[n]; j != nil {
		return j
	}
	ctx := context.Background()
	st := mem.MustNew(mem.Options{TTL: time.Second})
	cfg := spate.TimingsForLease(time.Second)
	cfg.InstanceID = "w-1"
	cfg.RebalanceDelay = spate.NoRebalanceDelay
	c, err := spate.NewStoreCoordinator(st, cfg, spate.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Abandon()
	c.SetWaker(spate.NewWaker())
	if err := c.Start(benchPlanner{n: n}); err != nil {
		b.Fatal(err)
	}
	var held spate.SplitID
	deadline := time.Now().Add(5 * time.Minute)
	for held.String() == "" {
		if time.Now().After(deadline) {
			b.Fatalf("no split gained in a job of %d", n)
		}
		evs, err := c.Poll()
		if err != nil {
			b.Fatal(err)
		}
		for _, ev := range evs {
			if g, ok := ev.(spate.Gained); ok && held.String() == "" {
				held = g.Split.ID
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	j := &benchJob{st: st, split: held.String()}
	for i := range 64 {
		if err := c.Commit(ctx, held, spate.SplitProgress{Watermark: int64(i+1) * 1000}); err != nil {
			b.Fatal(err)
		}
		e, _, err := st.Get(ctx, spate.Durable, "split."+held.String())
		if err != nil {
			b.Fatal(err)
		}
		j.commits = append(j.commits, e)
	}
	for {
		dur, err := st.List(ctx, spate.Durable, "")
		if err != nil {
			b.Fatal(err)
		}
		if len(dur) >= 2*n+1 {
			j.dur = dur
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if j.eph, err = st.List(ctx, spate.Ephemeral, ""); err != nil {
		b.Fatal(err)
	}
	benchJobs[n] = j
	return j
}

// snapshot feeds a new follower the job as a watch's snapshot would.
func (j *benchJob) follower(b *testing.B) jobfollow.Follower {
	f := jobfollow.New("")
	f.Defer()
	defer func() {
		if err := f.Decode(); err != nil {
			b.Fatal(err)
		}
	}()
	for _, e := range j.dur {
		if _, err := f.Apply(spate.Durable, spate.WatchEvent{Kind: spate.WatchPut, Key: e.Key, Value: e.Value, Revision: e.Revision}); err != nil {
			b.Fatal(err)
		}
	}
	for _, e := range j.eph {
		if _, err := f.Apply(spate.Ephemeral, spate.WatchEvent{Kind: spate.WatchPut, Key: e.Key, Value: e.Value, Revision: e.Revision}); err != nil {
			b.Fatal(err)
		}
	}
	return f
}

func benchHub() *hub { return emptyHub("bench", slog.New(slog.NewTextHandler(io.Discard, nil))) }

var benchSizes = []int{1_000, 10_000, 100_000}

// BenchmarkViewPerCommit is the job view's cost of one commit in the
// store: the follower folds the record, the hub turns it into its row,
// keeps the summary and members, and sends the change to 10 open pages.
// Its cost should not grow with the job's splits.
func BenchmarkViewPerCommit(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("splits=%d", n), func(b *testing.B) {
			j := seedJob(b, n)
			f := j.follower(b)
			h := benchHub()
			h.rebuild(f, 0)
			close(h.ready)
			for range 10 {
				ch, _ := h.subscribe("")
				go func() {
					for range ch {
					}
				}()
			}
			dirty := map[string]bool{}
			rev := j.commits[len(j.commits)-1].Revision
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				e := j.commits[i%len(j.commits)]
				rev++
				touched, err := f.Apply(spate.Durable, spate.WatchEvent{Kind: spate.WatchPut, Key: e.Key, Value: e.Value, Revision: rev})
				if err != nil {
					b.Fatal(err)
				}
				dirty[touched.Split] = true
				h.update(f, dirty, rev, false)
				clear(dirty)
			}
		})
	}
}

// BenchmarkViewPerCommitByRereading is what a commit cost before the
// follower: a re-read of the whole job (InspectJob over the store) and
// every row rebuilt. Side by side with BenchmarkViewPerCommit.
func BenchmarkViewPerCommitByRereading(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("splits=%d", n), func(b *testing.B) {
			j := seedJob(b, n)
			st := mem.MustNew(mem.Options{TTL: 30 * time.Second})
			defer st.Close()
			ctx := context.Background()
			for _, e := range j.dur {
				if _, err := st.Create(ctx, spate.Durable, e.Key, e.Value); err != nil {
					b.Fatal(err)
				}
			}
			rates := map[string]rate{}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				js, err := spate.InspectJob(ctx, st, "")
				if err != nil {
					b.Fatal(err)
				}
				var s summary
				for _, sp := range js.Splits {
					s.count(rowOf(sp, time.Now(), rates), 1)
				}
			}
		})
	}
}

// BenchmarkViewOpen is the first page's wait on a job nobody watched
// yet: the watches' snapshots folded into a follower (every record
// decoded strictly) and the view built whole.
func BenchmarkViewOpen(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("splits=%d", n), func(b *testing.B) {
			j := seedJob(b, n)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				h := benchHub()
				h.rebuild(j.follower(b), 0)
			}
		})
	}
}

// BenchmarkViewFirstPaint is a page's first paint of a followed job: the
// job page rendered on the server from the hub's view (the first 500
// rows of the job's splits, sorted, and the summary, members and chart).
func BenchmarkViewFirstPaint(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("splits=%d", n), func(b *testing.B) {
			j := seedJob(b, n)
			h := benchHub()
			h.rebuild(j.follower(b), 0)
			close(h.ready)
			s := New(Config{Store: "mem://"})
			s.hubs["bench"] = h
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				rec := httptest.NewRecorder()
				s.ServeHTTP(rec, httptest.NewRequest("GET", "/jobs/bench", nil))
				if rec.Code != 200 {
					b.Fatalf("GET: %d %s", rec.Code, rec.Body)
				}
			}
		})
	}
}

// benchOpener opens the bench job's store.
type benchOpener struct{ st *mem.Store }

func (o benchOpener) Jobs(context.Context) ([]string, error) { return []string{"bench"}, nil }
func (o benchOpener) Open(context.Context, string) (spate.Store, error) {
	return o.st.Connect()
}

// BenchmarkViewColdPage is the whole wait of the first page of a job
// nobody watched yet, as a browser sees it: a new server's GET of the job
// page opens the job's watches, folds both snapshots, builds the view
// and renders the page.
func BenchmarkViewColdPage(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("splits=%d", n), func(b *testing.B) {
			j := seedJob(b, n)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				s := New(Config{Opener: benchOpener{j.st}, Store: "mem://", Log: slog.New(slog.DiscardHandler)})
				rec := httptest.NewRecorder()
				s.ServeHTTP(rec, httptest.NewRequest("GET", "/jobs/bench", nil))
				if rec.Code != 200 {
					b.Fatalf("GET: %d %s", rec.Code, rec.Body)
				}
				b.StopTimer()
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
