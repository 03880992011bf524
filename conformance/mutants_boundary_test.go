package conformance_test

import (
	"context"
	"runtime"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/mem"
)

// Two broken watches that only writes landing while the watch is being set
// up can reveal, each built for the whole watch and for key watches.
func init() {
	mutants = append(mutants,
		// The snapshot is read first and the live stream subscribed only
		// after it (a round trip later): writes in between are never
		// delivered.
		mutant{name: "subscribe-after-snapshot", breaks: []string{"WatchHasNoGaps"},
			wrap: func(_ *shared, s *mem.Store) spate.Store {
				return &hooked{Store: s, watch: func(ctx context.Context, ks spate.Keyspace, p string) (<-chan spate.WatchEvent, error) {
					return subscribeAfterSnapshot(ctx, func() ([]spate.Entry, error) { return s.List(ctx, ks, p) },
						func() (<-chan spate.WatchEvent, error) { return s.Watch(ctx, ks, p) })
				}}
			}},
		mutant{name: "watchkeys-subscribe-after-snapshot", breaks: []string{"WatchKeysHasNoGaps"},
			wrap: func(_ *shared, s *mem.Store) spate.Store {
				return &keyWatching{hooked: &hooked{Store: s}, wk: func(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
					return subscribeAfterSnapshot(ctx, func() ([]spate.Entry, error) { return getAll(ctx, s, ks, keys) },
						func() (<-chan spate.WatchEvent, error) { return s.WatchKeys(ctx, ks, keys) })
				}}
			}},
		// The live stream starts before the snapshot is read: after
		// SnapshotDone it replays revisions older than the ones the
		// snapshot delivered.
		mutant{name: "live-stream-rewinds", breaks: []string{"WatchKeepsEachKeysRevisionOrder"},
			wrap: func(_ *shared, s *mem.Store) spate.Store {
				return &hooked{Store: s, watch: func(ctx context.Context, ks spate.Keyspace, p string) (<-chan spate.WatchEvent, error) {
					return rewindingLive(ctx, func() ([]spate.Entry, error) { return s.List(ctx, ks, p) },
						func() (<-chan spate.WatchEvent, error) { return s.Watch(ctx, ks, p) })
				}}
			}},
		mutant{name: "watchkeys-live-stream-rewinds", breaks: []string{"WatchKeysHasNoGaps"},
			wrap: func(_ *shared, s *mem.Store) spate.Store {
				return &keyWatching{hooked: &hooked{Store: s}, wk: func(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
					return rewindingLive(ctx, func() ([]spate.Entry, error) { return getAll(ctx, s, ks, keys) },
						func() (<-chan spate.WatchEvent, error) { return s.WatchKeys(ctx, ks, keys) })
				}}
			}},
	)
}

func getAll(ctx context.Context, s *mem.Store, ks spate.Keyspace, keys []string) ([]spate.Entry, error) {
	var out []spate.Entry
	for _, k := range keys {
		e, ok, err := s.Get(ctx, ks, k)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, e)
		}
	}
	return out, nil
}

// boundaryRelay sends snap as the snapshot, then SnapshotDone, then what live
// delivers after its own SnapshotDone (skipLiveSnapshot) or all of it but
// its SnapshotDone.
func boundaryRelay(ctx context.Context, snap []spate.Entry, live <-chan spate.WatchEvent, skipLiveSnapshot bool) <-chan spate.WatchEvent {
	out := make(chan spate.WatchEvent)
	go func() {
		defer close(out)
		send := func(ev spate.WatchEvent) bool {
			select {
			case out <- ev:
				return true
			case <-ctx.Done():
				return false
			}
		}
		for _, e := range snap {
			if !send(spate.WatchEvent{Kind: spate.WatchPut, Key: e.Key, Value: e.Value, Revision: e.Revision}) {
				return
			}
		}
		if !send(spate.WatchEvent{Kind: spate.WatchSnapshotDone}) {
			return
		}
		inSnapshot := true
		for ev := range live {
			if ev.Kind == spate.WatchSnapshotDone {
				inSnapshot = false
				continue
			}
			if skipLiveSnapshot && inSnapshot {
				continue
			}
			if !send(ev) {
				for range live {
				}
				return
			}
		}
	}()
	return out
}

func subscribeAfterSnapshot(ctx context.Context, snapshot func() ([]spate.Entry, error), live func() (<-chan spate.WatchEvent, error)) (<-chan spate.WatchEvent, error) {
	snap, err := snapshot()
	if err != nil {
		return nil, err
	}
	// The round trip between the two lasts, within a bound, until a key
	// the snapshot did not hold was created: that create is lost, and a
	// key written once is never superseded, so the gap stays. (A bare
	// pause of 200 yields let one land in only about 99.5% of runs.)
	untilCreated(snap, snapshot)
	ch, err := live()
	if err != nil {
		return nil, err
	}
	return boundaryRelay(ctx, snap, ch, true), nil
}

func rewindingLive(ctx context.Context, snapshot func() ([]spate.Entry, error), live func() (<-chan spate.WatchEvent, error)) (<-chan spate.WatchEvent, error) {
	ch, err := live()
	if err != nil {
		return nil, err
	}
	// The round trip to the server: the live stream runs on while the
	// snapshot is read. It lasts until the stream holds a key written
	// twice since it began (or the writes stop), so that the snapshot is
	// sure to be newer than something the stream replays after
	// SnapshotDone: a bare pause of 200 yields let the rule's writer land
	// two writes of one key in it in only about 96% of runs.
	buf := holdUntilRewritten(ctx, ch)
	snap, err := snapshot()
	if err != nil {
		return nil, err
	}
	return boundaryRelay(ctx, snap, prepend(ctx, buf, ch), false), nil
}

// holdUntilRewritten reads live until a key has two live events (after
// the stream's own SnapshotDone), or nothing arrived for a second (in the
// suite's synctest bubble: until every goroutine is blocked, so the writer
// can write no more), and returns what it read.
func holdUntilRewritten(ctx context.Context, live <-chan spate.WatchEvent) []spate.WatchEvent {
	var buf []spate.WatchEvent
	seen := map[string]int{}
	inSnapshot := true
	idle := time.NewTimer(time.Second)
	defer idle.Stop()
	for {
		select {
		case ev, ok := <-live:
			if !ok {
				return buf
			}
			buf = append(buf, ev)
			idle.Reset(time.Second)
			if ev.Kind == spate.WatchSnapshotDone {
				inSnapshot = false
				continue
			}
			if !inSnapshot {
				if seen[ev.Key]++; seen[ev.Key] == 2 {
					return buf
				}
			}
		case <-idle.C:
			return buf
		case <-ctx.Done():
			return buf
		}
	}
}

// prepend delivers buf, then what live delivers.
func prepend(ctx context.Context, buf []spate.WatchEvent, live <-chan spate.WatchEvent) <-chan spate.WatchEvent {
	out := make(chan spate.WatchEvent)
	go func() {
		defer close(out)
		for _, ev := range buf {
			select {
			case out <- ev:
			case <-ctx.Done():
				for range live {
				}
				return
			}
		}
		for ev := range live {
			select {
			case out <- ev:
			case <-ctx.Done():
				for range live {
				}
				return
			}
		}
	}()
	return out
}

// untilCreated reads again, yielding between reads, until a key that
// snap does not hold exists (at most 200 reads).
func untilCreated(snap []spate.Entry, read func() ([]spate.Entry, error)) {
	held := make(map[string]bool, len(snap))
	for _, e := range snap {
		held[e.Key] = true
	}
	for range 200 {
		pause()
		cur, err := read()
		if err != nil {
			return
		}
		for _, e := range cur {
			if !held[e.Key] {
				return
			}
		}
	}
}

// pause stands for a round trip to the server: it lets other goroutines
// (the rule's writer) run, without sleeping (the suite runs these mutants
// in a synctest bubble, where a sleep would wait for the writer to stop).
func pause() {
	for range 200 {
		runtime.Gosched()
	}
}
