package conformance_test

import (
	"context"
	"sync"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/mem"
)

// keyWatching is a mutant store whose WatchKeys is wk; the rest is the
// hooked mem store (which reports the capability).
type keyWatching struct {
	*hooked
	wk func(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error)
}

func (k *keyWatching) WatchKeys(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
	return k.wk(ctx, ks, keys)
}

// filterKeys runs s's key watch through f, which maps each event (seq
// counts them) to what is delivered instead.
func filterKeys(s *mem.Store, f func(ks spate.Keyspace, ev spate.WatchEvent, seq int) []spate.WatchEvent) spate.Store {
	return &keyWatching{hooked: &hooked{Store: s}, wk: func(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
		in, err := s.WatchKeys(ctx, ks, keys)
		if err != nil {
			return nil, err
		}
		out := make(chan spate.WatchEvent)
		go func() {
			defer close(out)
			seq := 0
			for ev := range in {
				for _, x := range f(ks, ev, seq) {
					select {
					case out <- x:
					case <-ctx.Done():
						for range in {
						}
						return
					}
				}
				seq++
			}
		}()
		return out, nil
	}}
}

// merged opens one watch per element of each (a sub-watch's arguments)
// with open and merges them: every snapshot, one SnapshotDone, then every
// live event. Used to build key watches out of other watches.
func merged(ctx context.Context, each [][]string, open func(context.Context, []string) (<-chan spate.WatchEvent, error)) (<-chan spate.WatchEvent, error) {
	ctx, cancel := context.WithCancel(ctx)
	var ins []<-chan spate.WatchEvent
	for _, a := range each {
		ch, err := open(ctx, a)
		if err != nil {
			cancel()
			return nil, err
		}
		ins = append(ins, ch)
	}
	out := make(chan spate.WatchEvent)
	go func() {
		defer close(out)
		defer cancel()
		send := func(ev spate.WatchEvent) bool {
			select {
			case out <- ev:
				return true
			case <-ctx.Done():
				return false
			}
		}
		for _, in := range ins {
			for ev := range in {
				if ev.Kind == spate.WatchSnapshotDone {
					break
				}
				if !send(ev) {
					return
				}
			}
		}
		if !send(spate.WatchEvent{Kind: spate.WatchSnapshotDone}) {
			return
		}
		var wg sync.WaitGroup
		for _, in := range ins {
			wg.Go(func() {
				for ev := range in {
					if !send(ev) {
						return
					}
				}
			})
		}
		wg.Wait()
	}()
	return out, nil
}

// watchKeysMutants break the rules of the optional KeyWatcher capability.
var watchKeysMutants = []mutant{
	{name: "reports-keywatcher-without-it", breaks: []string{"KeyWatcherIsReported"},
		wrap: func(_ *shared, s *mem.Store) spate.Store { return hidesReleaser{s} }},
	{name: "watchkeys-snapshot-misses-key", breaks: []string{"WatchKeysSnapshotHoldsTheLiveListedKeys"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return filterKeys(s, func(_ spate.Keyspace, ev spate.WatchEvent, seq int) []spate.WatchEvent {
				if seq == 0 && ev.Kind == spate.WatchPut {
					return nil
				}
				return []spate.WatchEvent{ev}
			})
		}},
	// A key watch built from one prefix watch per key: "k" also brings
	// "k1" and "k.x".
	{name: "watchkeys-by-prefix", breaks: []string{"WatchKeysDeliversOnlyListedKeys", "WatchKeysSnapshotHoldsTheLiveListedKeys"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &keyWatching{hooked: &hooked{Store: s}, wk: func(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
				var each [][]string
				for _, k := range keys {
					each = append(each, []string{k})
				}
				return merged(ctx, each, func(ctx context.Context, a []string) (<-chan spate.WatchEvent, error) {
					return s.Watch(ctx, ks, a[0])
				})
			}}
		}},
	{name: "watchkeys-drops-deletes", breaks: []string{"WatchKeysDeliversPutsDeletesAndExpiry"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return filterKeys(s, func(_ spate.Keyspace, ev spate.WatchEvent, _ int) []spate.WatchEvent {
				if ev.Kind == spate.WatchDelete {
					return nil
				}
				return []spate.WatchEvent{ev}
			})
		}},
	{name: "watchkeys-drops-expiry", breaks: []string{"WatchKeysDeliversPutsDeletesAndExpiry"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return filterKeys(s, func(ks spate.Keyspace, ev spate.WatchEvent, _ int) []spate.WatchEvent {
				if ks == spate.Ephemeral && ev.Kind == spate.WatchDelete && ev.Key == "wkl.other" {
					return nil // the one delete no client asked for
				}
				return []spate.WatchEvent{ev}
			})
		}},
	// The snapshot is read, and only a moment later the live stream
	// begins: writes in between are lost.
	{name: "watchkeys-racy-snapshot", breaks: []string{"WatchKeysHasNoGaps"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &keyWatching{hooked: &hooked{Store: s}, wk: func(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
				var snap []spate.Entry
				for _, k := range keys {
					e, ok, err := s.Get(ctx, ks, k)
					if err != nil {
						return nil, err
					}
					if ok {
						snap = append(snap, e)
					}
				}
				time.Sleep(20 * time.Millisecond)
				in, err := s.WatchKeys(ctx, ks, keys)
				if err != nil {
					return nil, err
				}
				out := make(chan spate.WatchEvent)
				go func() {
					defer close(out)
					for _, e := range snap {
						select {
						case out <- spate.WatchEvent{Kind: spate.WatchPut, Key: e.Key, Value: e.Value, Revision: e.Revision}:
						case <-ctx.Done():
							return
						}
					}
					for ev := range in {
						if ev.Kind == spate.WatchPut && len(snap) > 0 {
							continue // this watch's own snapshot: the gap stays
						}
						if ev.Kind == spate.WatchSnapshotDone {
							snap = nil
						}
						select {
						case out <- ev:
						case <-ctx.Done():
							return
						}
					}
				}()
				return out, nil
			}}
		}},
	// One watch per listed key, the repeated one twice.
	{name: "watchkeys-per-listed-key", breaks: []string{"WatchKeysWatchesARepeatedKeyOnce"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &keyWatching{hooked: &hooked{Store: s}, wk: func(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
				var each [][]string
				for _, k := range keys {
					each = append(each, []string{k})
				}
				return merged(ctx, each, func(ctx context.Context, a []string) (<-chan spate.WatchEvent, error) {
					return s.WatchKeys(ctx, ks, a)
				})
			}}
		}},
	{name: "watchkeys-accepts-any-count", breaks: []string{"WatchKeysArgumentsAreChecked"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &keyWatching{hooked: &hooked{Store: s}, wk: func(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
				if len(keys) == 0 || len(keys) > spate.MaxWatchKeys {
					out := make(chan spate.WatchEvent, 1)
					out <- spate.WatchEvent{Kind: spate.WatchSnapshotDone}
					close(out)
					return out, nil
				}
				return s.WatchKeys(ctx, ks, keys)
			}}
		}},
	{name: "watchkeys-outlives-its-context", breaks: []string{"WatchKeysEndsLikeAWatch"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &keyWatching{hooked: &hooked{Store: s}, wk: func(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
				return s.WatchKeys(context.WithoutCancel(ctx), ks, keys)
			}}
		}},
}
