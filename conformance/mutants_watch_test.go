package conformance_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/stores/mem"
)

// ttlMutants break expiry.
var ttlMutants = []mutant{
	{name: "ttl-runs-from-create", breaks: []string{"HeartbeatedEphemeralKeySurvives"}, wrap: ttlFromCreate},
	{name: "never-expires", breaks: []string{"ExpiredKeysReadAbsentAndAreRecreatable", "ExpiryReachesWatchersAsDelete"},
		harness: func() conformance.Harness {
			root := mem.MustNew(mem.Options{TTL: 1000 * ttl})
			return &harness{root: root, wrap: func(s *mem.Store) spate.Store {
				return &hooked{Store: s, caps: func(c spate.Capabilities) spate.Capabilities { c.TTL = ttl; return c }}
			}}
		}},
	{name: "expiry-silent", breaks: []string{"ExpiryReachesWatchersAsDelete"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, filter: func(ks spate.Keyspace, ev spate.WatchEvent, _ int) []spate.WatchEvent {
				if ks == spate.Ephemeral && ev.Kind == spate.WatchDelete {
					return nil
				}
				return []spate.WatchEvent{ev}
			}}
		}},
	// Redis's SET without KEEPTTL, or an etcd put without the lease: an
	// updated ephemeral key never expires (emulated: the update is
	// followed by a keep-alive of the key).
	{name: "update-makes-key-permanent", breaks: []string{"UpdatedEphemeralKeyExpiresAfterItsTTL"},
		wrap: func(sh *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, update: func(ctx context.Context, ks spate.Keyspace, key string, v []byte, exp uint64) (spate.Outcome, error) {
				o, err := s.Update(ctx, ks, key, v, exp)
				if err == nil && o.Won && ks == spate.Ephemeral {
					go func() {
						rev := o.Revision
						ttl := s.Capabilities().TTL
						for range 12 {
							if !sh.sleep(ttl / 3) {
								return
							}
							o, err := s.Update(context.Background(), ks, key, v, rev)
							if err != nil || !o.Won {
								return
							}
							rev = o.Revision
						}
					}()
				}
				return o, err
			}}
		}},
	// A script that re-arms the expiry before it checks the revision: a
	// lost update keeps the key alive (emulated: a lost update rewrites
	// the key at its current revision).
	{name: "lost-update-rearms-ttl", breaks: []string{"LostUpdateDoesNotRearmTheTTL"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, update: func(ctx context.Context, ks spate.Keyspace, key string, v []byte, exp uint64) (spate.Outcome, error) {
				o, err := s.Update(ctx, ks, key, v, exp)
				if err == nil && !o.Won && ks == spate.Ephemeral {
					if en, ok, gerr := s.Get(ctx, ks, key); gerr == nil && ok {
						_, _ = s.Update(ctx, ks, key, en.Value, en.Revision)
					}
				}
				return o, err
			}}
		}},
	{name: "durable-expires", breaks: []string{"DurableKeysNeverExpire"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, ks: func(spate.Keyspace) spate.Keyspace { return spate.Ephemeral }}
		}},

	// Keys expire at half the TTL the store reports (a lease granted at
	// open, a TTL rounded down to the server's unit).
	{name: "ttl-runs-short", breaks: []string{"EphemeralKeyLivesItsWholeTTL"},
		harness: func() conformance.Harness {
			root := mem.MustNew(mem.Options{TTL: ttl / 2})
			return &harness{root: root, wrap: func(s *mem.Store) spate.Store {
				return &hooked{Store: s, caps: func(c spate.Capabilities) spate.Capabilities { c.TTL = ttl; return c }}
			}}
		}},
	// A client-side deadline check in Get alone, a quarter TTL early: the
	// other primitives still see the key.
	{name: "get-expires-early", breaks: []string{"ExpiryIsOneInstantForEveryPrimitive"},
		wrap: func(sh *shared, s *mem.Store) spate.Store {
			written := func(ks spate.Keyspace, k string, o spate.Outcome, err error) (spate.Outcome, error) {
				if err == nil && o.Won && ks == spate.Ephemeral {
					sh.mu.Lock()
					sh.created[k] = time.Now()
					sh.mu.Unlock()
				}
				return o, err
			}
			return &hooked{Store: s,
				create: func(ctx context.Context, ks spate.Keyspace, k string, v []byte) (spate.Outcome, error) {
					o, err := s.Create(ctx, ks, k, v)
					return written(ks, k, o, err)
				},
				update: func(ctx context.Context, ks spate.Keyspace, k string, v []byte, exp uint64) (spate.Outcome, error) {
					o, err := s.Update(ctx, ks, k, v, exp)
					return written(ks, k, o, err)
				},
				get: func(ctx context.Context, ks spate.Keyspace, k string) (spate.Entry, bool, error) {
					sh.mu.Lock()
					at, ok := sh.created[k]
					sh.mu.Unlock()
					if ks == spate.Ephemeral && ok && time.Since(at) > 3*ttl/4 {
						return spate.Entry{}, false, nil
					}
					return s.Get(ctx, ks, k)
				}}
		}},
	// Expiry deletes reach watchers a TTL late: the reported latency is 0.
	{name: "expiry-delivered-late", breaks: []string{"ExpiryReachesWatchersWithinTheLatency"},
		wrap: func(sh *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, filter: func(ks spate.Keyspace, ev spate.WatchEvent, _ int) []spate.WatchEvent {
				if ks == spate.Ephemeral && ev.Kind == spate.WatchDelete {
					sh.sleep(ttl)
				}
				return []spate.WatchEvent{ev}
			}}
		}},
}

// relay runs a watch of inner through step, which gets each event and a
// send function, on a goroutine of its own; the stream ends with ctx or
// when inner ends (or step returns false).
func relay(ctx context.Context, inner <-chan spate.WatchEvent, step func(ev spate.WatchEvent, send func(spate.WatchEvent) bool) bool) <-chan spate.WatchEvent {
	out := make(chan spate.WatchEvent)
	go func() {
		defer func() { // close first, then let inner run out
			close(out)
			for range inner {
			}
		}()
		send := func(ev spate.WatchEvent) bool {
			select {
			case out <- ev:
				return true
			case <-ctx.Done():
				return false
			}
		}
		for ev := range inner {
			if !step(ev, send) {
				return
			}
		}
	}()
	return out
}

// watchWith wraps s's watches in a relay made by mk, one per watch.
func watchWith(s *mem.Store, mk func(ctx context.Context) func(spate.WatchEvent, func(spate.WatchEvent) bool) bool) *hooked {
	return &hooked{Store: s, watch: func(ctx context.Context, ks spate.Keyspace, p string) (<-chan spate.WatchEvent, error) {
		inner, err := s.Watch(ctx, ks, p)
		if err != nil {
			return nil, err
		}
		return relay(ctx, inner, mk(ctx)), nil
	}}
}

// smallWatchBuffer makes the store cut a watcher off 256 events behind:
// with the default 4096, whether 5000 unread changes overflow it depends
// on how many the watcher's goroutine took before it blocked, and the lag
// mutants below need the break every time.
func smallWatchBuffer(o *mem.Options) { o.WatchBuffer = 256 }

// largeWatchBuffer keeps the store from cutting a watcher off, so that a
// mutant's own lossy buffer is what the lagging watcher meets.
func largeWatchBuffer(o *mem.Options) { o.WatchBuffer = 1 << 20 }

// watchMutants break watches.
var watchMutants = []mutant{
	{name: "no-snapshot-done", breaks: []string{"WatchSnapshotThenOneSnapshotDone"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, filter: func(_ spate.Keyspace, ev spate.WatchEvent, _ int) []spate.WatchEvent {
				if ev.Kind == spate.WatchSnapshotDone {
					return nil
				}
				return []spate.WatchEvent{ev}
			}}
		}},
	{name: "double-snapshot-done", breaks: []string{"WatchSnapshotThenOneSnapshotDone"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, filter: func(_ spate.Keyspace, ev spate.WatchEvent, _ int) []spate.WatchEvent {
				if ev.Kind == spate.WatchSnapshotDone {
					return []spate.WatchEvent{ev, ev}
				}
				return []spate.WatchEvent{ev}
			}}
		}},
	{name: "snapshot-misses-key", breaks: []string{"WatchSnapshotThenOneSnapshotDone"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, filter: func(_ spate.Keyspace, ev spate.WatchEvent, seq int) []spate.WatchEvent {
				if seq == 0 && ev.Kind == spate.WatchPut {
					return nil // the first snapshot put vanishes
				}
				return []spate.WatchEvent{ev}
			}}
		}},
	{name: "watch-ignores-prefix", breaks: []string{"WatchFiltersByPrefix"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, watch: func(ctx context.Context, ks spate.Keyspace, _ string) (<-chan spate.WatchEvent, error) {
				return s.Watch(ctx, ks, "")
			}}
		}},
	{name: "watch-gap", breaks: []string{"WatchHasNoGaps"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			live := 0
			var mu sync.Mutex
			return &hooked{Store: s, filter: func(_ spate.Keyspace, ev spate.WatchEvent, _ int) []spate.WatchEvent {
				mu.Lock()
				defer mu.Unlock()
				if ev.Kind == spate.WatchPut {
					live++
					if live%25 == 0 {
						return nil
					}
				}
				return []spate.WatchEvent{ev}
			}}
		}},
	// A watch that ignores its context: the channel never closes when the
	// consumer cancels it (a forgotten select on ctx.Done in the pump).
	{name: "watch-ignores-cancel", breaks: []string{"CancelledWatchEndsAndCloses"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, watch: func(ctx context.Context, ks spate.Keyspace, p string) (<-chan spate.WatchEvent, error) {
				inner, err := s.Watch(context.WithoutCancel(ctx), ks, p)
				if err != nil {
					return nil, err
				}
				out := make(chan spate.WatchEvent)
				go func() {
					for ev := range inner {
						out <- ev // never closes while the inner stream lives
					}
					close(out)
				}()
				return out, nil
			}}
		}},
	// A live subscription made after the snapshot read: the first events
	// after SnapshotDone never arrive. The rule used to pass it whenever
	// its writer finished before the watch was open (no live events).
	{name: "late-live-subscription", breaks: []string{"WatchHasNoGaps"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			var mu sync.Mutex
			afterSnap, dropped := false, 0
			return &hooked{Store: s, filter: func(_ spate.Keyspace, ev spate.WatchEvent, seq int) []spate.WatchEvent {
				mu.Lock()
				defer mu.Unlock()
				if seq == 0 {
					afterSnap, dropped = false, 0
				}
				switch {
				case ev.Kind == spate.WatchSnapshotDone:
					afterSnap = true
				case afterSnap && dropped < 30 && (ev.Kind == spate.WatchPut || ev.Kind == spate.WatchDelete):
					dropped++
					return nil
				}
				return []spate.WatchEvent{ev}
			}}
		}},
	{name: "durable-delete-silent", breaks: []string{"WatchDeliversDeletes"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, filter: func(ks spate.Keyspace, ev spate.WatchEvent, _ int) []spate.WatchEvent {
				if ks == spate.Durable && ev.Kind == spate.WatchDelete {
					return nil
				}
				return []spate.WatchEvent{ev}
			}}
		}},

	// Live puts without their value (a notification the driver did not
	// fetch the value for).
	{name: "put-event-without-value", breaks: []string{"WatchPutCarriesItsWrite"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			var mu sync.Mutex
			live := false
			return &hooked{Store: s, filter: func(_ spate.Keyspace, ev spate.WatchEvent, seq int) []spate.WatchEvent {
				mu.Lock()
				defer mu.Unlock()
				if seq == 0 {
					live = false
				}
				switch {
				case ev.Kind == spate.WatchSnapshotDone:
					live = true
				case live && ev.Kind == spate.WatchPut:
					ev.Value = nil
				}
				return []spate.WatchEvent{ev}
			}}
		}},
	// Delete events carry the key's last put revision.
	{name: "delete-event-reuses-put-revision", breaks: []string{"WatchDeliversDeletes"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			var mu sync.Mutex
			last := map[string]uint64{}
			return &hooked{Store: s, filter: func(ks spate.Keyspace, ev spate.WatchEvent, _ int) []spate.WatchEvent {
				mu.Lock()
				defer mu.Unlock()
				k := ks.String() + "/" + ev.Key
				switch ev.Kind {
				case spate.WatchPut:
					last[k] = ev.Revision
				case spate.WatchDelete:
					ev.Revision = last[k]
				}
				return []spate.WatchEvent{ev}
			}}
		}},
	// A coalescing buffer that keeps a key's first pending revision and
	// drops the later ones, the latest among them.
	{name: "coalesce-keeps-oldest", breaks: []string{"WatchDeliversEveryKeysLatestRevision"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, watch: func(ctx context.Context, ks spate.Keyspace, p string) (<-chan spate.WatchEvent, error) {
				inner, err := s.Watch(ctx, ks, p)
				if err != nil {
					return nil, err
				}
				out := make(chan spate.WatchEvent)
				go func() {
					defer close(out)
					var queue []spate.WatchEvent
					pending := map[string]bool{}
					in := inner
					for in != nil || len(queue) > 0 {
						var send chan spate.WatchEvent
						var next spate.WatchEvent
						if len(queue) > 0 {
							send, next = out, queue[0]
						}
						select {
						case ev, ok := <-in:
							if !ok {
								in = nil
								continue
							}
							if ev.Key != "" && pending[ev.Key] {
								continue // coalesced: into the older one
							}
							pending[ev.Key] = ev.Key != ""
							queue = append(queue, ev)
						case send <- next:
							queue = queue[1:]
							delete(pending, next.Key)
						case <-ctx.Done():
							for range inner {
							}
							return
						}
					}
				}()
				return out, nil
			}}
		}},
	// Each key's events delivered in pairs, the newer first.
	{name: "reorder-same-key", breaks: []string{"WatchKeepsEachKeysRevisionOrder"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			var mu sync.Mutex
			held := map[string]spate.WatchEvent{}
			return &hooked{Store: s, filter: func(_ spate.Keyspace, ev spate.WatchEvent, _ int) []spate.WatchEvent {
				mu.Lock()
				defer mu.Unlock()
				if ev.Kind != spate.WatchPut && ev.Kind != spate.WatchDelete {
					return []spate.WatchEvent{ev}
				}
				if h, ok := held[ev.Key]; ok {
					delete(held, ev.Key)
					return []spate.WatchEvent{ev, h}
				}
				held[ev.Key] = ev
				return nil
			}}
		}},
	// A relay with a 256-event buffer that drops what does not fit.
	{name: "slow-watcher-drops-silently", breaks: []string{"LaggingWatcherConvergesOrBreaksRetryable"}, mem: largeWatchBuffer,
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, watch: func(ctx context.Context, ks spate.Keyspace, p string) (<-chan spate.WatchEvent, error) {
				inner, err := s.Watch(ctx, ks, p)
				if err != nil {
					return nil, err
				}
				buf := make(chan spate.WatchEvent, 256)
				go func() {
					defer close(buf)
					for ev := range inner {
						select {
						case buf <- ev:
						default: // full: dropped
						}
					}
				}()
				return buf, nil
			}}
		}},
	// A lagging watch that just closes: no WatchError.
	{name: "lag-ends-without-error", breaks: []string{"LaggingWatcherConvergesOrBreaksRetryable"}, mem: smallWatchBuffer,
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return watchWith(s, func(context.Context) func(spate.WatchEvent, func(spate.WatchEvent) bool) bool {
				return func(ev spate.WatchEvent, send func(spate.WatchEvent) bool) bool {
					if ev.Kind == spate.WatchError {
						return false
					}
					return send(ev)
				}
			})
		}},
	{name: "lag-error-is-fatal", breaks: []string{"LaggingWatcherConvergesOrBreaksRetryable"}, mem: smallWatchBuffer,
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, filter: func(_ spate.Keyspace, ev spate.WatchEvent, _ int) []spate.WatchEvent {
				if ev.Kind == spate.WatchError {
					ev.Err = fmt.Errorf("mem: watcher too slow: %w", spate.ErrFatal)
				}
				return []spate.WatchEvent{ev}
			}}
		}},
	// A driver that reports the break, then re-watches by itself on the
	// same channel.
	{name: "lag-error-not-last", breaks: []string{"LaggingWatcherConvergesOrBreaksRetryable"}, mem: smallWatchBuffer,
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, watch: func(ctx context.Context, ks spate.Keyspace, p string) (<-chan spate.WatchEvent, error) {
				inner, err := s.Watch(ctx, ks, p)
				if err != nil {
					return nil, err
				}
				out := make(chan spate.WatchEvent)
				go func() {
					defer close(out)
					for inner != nil {
						next := inner
						inner = nil
						for ev := range next {
							select {
							case out <- ev:
							case <-ctx.Done():
								for range next {
								}
								return
							}
							if ev.Kind == spate.WatchError {
								if again, err := s.Watch(ctx, ks, p); err == nil {
									inner = again
								}
							}
						}
					}
				}()
				return out, nil
			}}
		}},
	// A watch that fails to establish reports it on the channel.
	{name: "watch-setup-error-in-stream", breaks: []string{"WatchSetupErrorsAreReturned"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, watch: func(ctx context.Context, ks spate.Keyspace, p string) (<-chan spate.WatchEvent, error) {
				ch, err := s.Watch(ctx, ks, p)
				if err == nil {
					return ch, nil
				}
				out := make(chan spate.WatchEvent, 1)
				out <- spate.WatchEvent{Kind: spate.WatchError, Err: err}
				close(out)
				return out, nil
			}}
		}},
}
