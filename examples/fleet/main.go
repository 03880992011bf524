// Command fleet runs a bounded coordinated job in one process: three workers
// share an in-memory store, divide twelve splits between them, and one
// worker crashes mid-run; its splits are taken over after their leases
// expire and resume from their last committed progress. At the end it
// verifies that every record of every split was processed at least once.
//
//	go run ./examples/fleet
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/mem"
)

const (
	splits       = 12
	records      = 300 // per split
	lease        = time.Second
	commitEvery  = 25
	recordPeriod = 5 * time.Millisecond
)

type planner struct{}

func (planner) Fingerprint() string { return "example-fleet:v1" }
func (planner) Plan(context.Context, spate.PlanContext) (spate.SplitPlan, error) {
	var ps []spate.PlannedSplit
	for i := range splits {
		ps = append(ps, spate.NewPlannedSplit(spate.NewSplitSpec(spate.MustSplitID(fmt.Sprintf("part-%02d", i)), nil)))
	}
	return spate.NewSplitPlan(ps, spate.PlanFinal), nil
}

// seen records every processed record, duplicates included.
type seen struct {
	mu    sync.Mutex
	count map[string]int
}

func (s *seen) add(split string, rec int64) {
	s.mu.Lock()
	s.count[fmt.Sprintf("%s/%d", split, rec)]++
	s.mu.Unlock()
}

func main() {
	store := mem.MustNew(mem.Options{TTL: lease})
	defer store.Close()
	out := &seen{count: map[string]int{}}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("SPATE_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	start := time.Now()
	var wg sync.WaitGroup
	crash := make(chan struct{})
	for i := range 3 {
		name := fmt.Sprintf("worker-%d", i)
		cfg := spate.Config{InstanceID: name, LeaseDuration: lease, OpTimeout: 200 * time.Millisecond,
			ReplanInterval: lease, ReconcileInterval: 300 * time.Millisecond, DrainDeadline: 500 * time.Millisecond,
			RebalanceDelay: spate.NoRebalanceDelay, MaxInFlight: 4}
		var s spate.Store = store
		if i == 0 {
			s = &crashable{Store: store, crashed: crash}
		}
		c, err := spate.NewStoreCoordinator(s, cfg, spate.WithLogger(logger.With("worker", name)))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		wg.Go(func() { runWorker(name, c, out, start, i == 0, crash) })
	}
	wg.Wait()

	missing, dups := 0, 0
	for sp := range splits {
		for r := range int64(records) {
			n := out.count[fmt.Sprintf("part-%02d/%d", sp, r)]
			if n == 0 {
				missing++
			}
			dups += max(n-1, 0)
		}
	}
	fmt.Printf("verified %d records: %d missing, %d replayed duplicates (the crashed worker's uncommitted tail)\n",
		splits*records, missing, dups)
	if missing > 0 {
		os.Exit(1)
	}
}

func runWorker(name string, c *spate.StoreCoordinator, out *seen, start time.Time, crasher bool, crash chan struct{}) {
	waker := spate.NewWaker()
	c.SetWaker(waker)
	if err := c.Start(planner{}); err != nil {
		panic(err)
	}
	defer c.Close()
	type tenancy struct {
		epoch           spate.LeaseEpoch
		next, committed int64
	}
	held := map[spate.SplitID]*tenancy{}
	completed := 0
	ctx := context.Background()
	say := func(format string, args ...any) {
		fmt.Printf("%6.2fs %-8s %s\n", time.Since(start).Seconds(), name, fmt.Sprintf(format, args...))
	}
	tick := time.NewTicker(recordPeriod)
	defer tick.Stop()
	for {
		work := false
		select {
		case <-waker.C():
		case <-tick.C:
			work = true
		}
		events, err := c.Poll()
		if err != nil {
			say("stopped: %v", err)
			return
		}
		for _, ev := range events {
			switch e := ev.(type) {
			case spate.Gained:
				t := &tenancy{epoch: e.Epoch}
				from := "the start"
				if e.Progress != nil {
					t.next, t.committed = e.Progress.Watermark, e.Progress.Watermark
					from = fmt.Sprintf("record %d", e.Progress.Watermark)
				}
				held[e.Split.ID] = t
				say("gained %s (epoch %d), resuming from %s", e.Split.ID, e.Epoch, from)
			case spate.Lost:
				delete(held, e.Split)
				say("lost %s", e.Split)
			case spate.RevokeRequested:
				if t, ok := held[e.Split]; ok {
					if c.CommitAt(ctx, e.Split, t.epoch, spate.NewSplitProgress(t.next, nil)) == nil {
						_ = c.ReleaseDrained(ctx, e.Split)
						say("handed %s back at record %d (rebalance)", e.Split, t.next)
					}
					delete(held, e.Split)
				}
			case spate.AllComplete:
				say("job complete (%d splits completed here)", completed)
				return
			}
		}
		if crasher && time.Since(start) > 1200*time.Millisecond {
			say("crashes, holding %d splits", len(held))
			close(crash)
			return
		}
		if !work {
			continue
		}
		for _, id := range slices.SortedFunc(func(yield func(spate.SplitID) bool) {
			for id := range held {
				if !yield(id) {
					return
				}
			}
		}, spate.SplitID.Compare) {
			t := held[id]
			out.add(id.String(), t.next)
			t.next++
			switch {
			case t.next == records:
				if err := c.CommitAt(ctx, id, t.epoch, spate.CompletedProgress(t.next, nil)); err == nil {
					completed++
				}
				delete(held, id)
			case t.next-t.committed >= commitEvery:
				if err := c.CommitAt(ctx, id, t.epoch, spate.NewSplitProgress(t.next, nil)); err == nil {
					t.committed = t.next
				} else if spate.IsFenced(err) {
					delete(held, id)
				}
			}
		}
	}
}

// crashable cuts a worker off from the store when crashed closes, as a
// process death would: nothing it held is handed back.
type crashable struct {
	spate.Store
	crashed chan struct{}
}

// Capabilities passes the store's on, the Releaser, KeyWatcher and
// Sessioner capabilities included.
func (c *crashable) Capabilities() spate.Capabilities {
	caps := c.Store.Capabilities()
	_, caps.UpdateAndDelete = spate.ReleaserOf(c.Store)
	_, caps.WatchKeys = spate.KeyWatcherOf(c.Store)
	_, caps.Sessions = spate.SessionerOf(c.Store)
	return caps
}

// NewSession passes the store's Sessioner capability on; a crashed
// worker's session calls fail, so its session expires as a dead
// process's would.
func (c *crashable) NewSession(ctx context.Context) (spate.Session, error) {
	if err := c.dead(); err != nil {
		return nil, err
	}
	sr, ok := spate.SessionerOf(c.Store)
	if !ok {
		return nil, fmt.Errorf("the store has no Sessioner capability: %w", spate.ErrFatal)
	}
	in, err := sr.NewSession(ctx)
	if err != nil {
		return nil, err
	}
	return &crashableSession{Session: in, c: c}, nil
}

type crashableSession struct {
	spate.Session
	c *crashable
}

func (s *crashableSession) Create(ctx context.Context, k string, v []byte) (spate.Outcome, error) {
	if err := s.c.dead(); err != nil {
		return spate.Outcome{}, err
	}
	return s.Session.Create(ctx, k, v)
}

func (s *crashableSession) Update(ctx context.Context, k string, v []byte, r uint64) (spate.Outcome, error) {
	if err := s.c.dead(); err != nil {
		return spate.Outcome{}, err
	}
	return s.Session.Update(ctx, k, v, r)
}

func (s *crashableSession) KeepAlive(ctx context.Context) error {
	if err := s.c.dead(); err != nil {
		return err
	}
	return s.Session.KeepAlive(ctx)
}

// Close does nothing once crashed: a dead process deletes nothing, and
// its keys go when the session expires.
func (s *crashableSession) Close() error {
	if err := s.c.dead(); err != nil {
		return nil
	}
	return s.Session.Close()
}

// WatchKeys passes the store's KeyWatcher capability on.
func (c *crashable) WatchKeys(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
	if err := c.dead(); err != nil {
		return nil, err
	}
	kw, ok := spate.KeyWatcherOf(c.Store)
	if !ok {
		return nil, fmt.Errorf("the store has no KeyWatcher capability: %w", spate.ErrFatal)
	}
	return kw.WatchKeys(ctx, ks, keys)
}

// UpdateAndDelete passes the store's Releaser capability on.
func (c *crashable) UpdateAndDelete(ctx context.Context, dk string, v []byte, r uint64, ek string, lr uint64) (spate.Outcome, spate.Outcome, error) {
	if err := c.dead(); err != nil {
		return spate.Outcome{}, spate.Outcome{}, err
	}
	rel, ok := spate.ReleaserOf(c.Store)
	if !ok {
		return spate.Outcome{}, spate.Outcome{}, fmt.Errorf("the store has no Releaser capability: %w", spate.ErrFatal)
	}
	return rel.UpdateAndDelete(ctx, dk, v, r, ek, lr)
}

func (c *crashable) dead() error {
	select {
	case <-c.crashed:
		return fmt.Errorf("worker crashed: %w", spate.ErrRetryable)
	default:
		return nil
	}
}

func (c *crashable) Create(ctx context.Context, ks spate.Keyspace, k string, v []byte) (spate.Outcome, error) {
	if err := c.dead(); err != nil {
		return spate.Outcome{}, err
	}
	return c.Store.Create(ctx, ks, k, v)
}

func (c *crashable) Update(ctx context.Context, ks spate.Keyspace, k string, v []byte, r uint64) (spate.Outcome, error) {
	if err := c.dead(); err != nil {
		return spate.Outcome{}, err
	}
	return c.Store.Update(ctx, ks, k, v, r)
}

func (c *crashable) Delete(ctx context.Context, ks spate.Keyspace, k string, r uint64) (spate.Outcome, error) {
	if err := c.dead(); err != nil {
		return spate.Outcome{}, err
	}
	return c.Store.Delete(ctx, ks, k, r)
}

func (c *crashable) Get(ctx context.Context, ks spate.Keyspace, k string) (spate.Entry, bool, error) {
	if err := c.dead(); err != nil {
		return spate.Entry{}, false, err
	}
	return c.Store.Get(ctx, ks, k)
}
