package conformance_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/stores/mem"
)

// slowMutants keep the contract on a slow machine, where the rules'
// own writers and readers take longer than on a quiet one. Rules that
// bounded a whole run by a fixed wait, or assumed an ephemeral key still
// live because the machine should have re-armed it by now, failed such
// stores (etcd and a NATS R3 cluster beside busy processes).
var slowMutants = []mutant{
	// Every call is one round trip of 100 ms (virtual time): the no-gaps
	// rules' writers (150 steps of two or three writes) run for about
	// 30 s, longer than the suite's event wait, while every event still
	// arrives at once; the 40 creates of ListNeverUnderReports take 4 s,
	// longer than the TTL (1.5 s), so its first keys expire before the
	// first listing.
	{name: "round-trips-of-100ms", wrap: func(sh *shared, s *mem.Store) spate.Store {
		return &hooked{Store: s, pre: func(context.Context, spate.Keyspace) error {
			if !sh.sleep(100 * time.Millisecond) {
				return spate.Retryablef("the store closed")
			}
			return nil
		}}
	}},
	// The snapshot is read key by key, as a NATS consumer delivers it,
	// 50 ms per key: a key that expires before its turn is folded away
	// (its delete follows live), so the snapshot holds the keys live
	// from the Watch call until SnapshotDone, not every key live when
	// the watch was opened.
	{name: "snapshot-read-key-by-key", wrap: func(sh *shared, s *mem.Store) spate.Store {
		return &hooked{Store: s, watch: func(ctx context.Context, ks spate.Keyspace, p string) (<-chan spate.WatchEvent, error) {
			in, err := s.Watch(ctx, ks, p)
			if err != nil {
				return nil, err
			}
			out := make(chan spate.WatchEvent)
			go func() {
				defer close(out)
				snapshot := true
				for ev := range in {
					switch {
					case ev.Kind == spate.WatchSnapshotDone:
						snapshot = false
					case snapshot && ev.Kind == spate.WatchPut:
						if !sh.sleep(50 * time.Millisecond) {
							return
						}
						if _, live, err := s.Get(ctx, ks, ev.Key); err == nil && !live {
							continue
						}
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
	// The process stalls once for 1.5 TTLs, before the first read of a
	// live ephemeral key of the harness, as a loaded machine stalls one
	// (load 5 to 6 beside a NATS R3 cluster with a 2 s TTL): the key the
	// rule wrote just before expires before the read. A rule that judges
	// a write by a read after it must tell that from a fault.
	{name: "a-stall-past-a-ttl-once", wrap: func(sh *shared, s *mem.Store) spate.Store {
		return &hooked{Store: s, get: func(ctx context.Context, ks spate.Keyspace, k string) (spate.Entry, bool, error) {
			if _, live, err := s.Get(ctx, ks, k); err != nil || !live || ks != spate.Ephemeral {
				return s.Get(ctx, ks, k)
			}
			sh.mu.Lock()
			stall := !sh.stalled
			sh.stalled = true
			sh.mu.Unlock()
			if stall && !sh.sleep(ttl*3/2) {
				return spate.Entry{}, false, spate.Retryablef("the store closed")
			}
			return s.Get(ctx, ks, k)
		}}
	}},
	// A key watch's SnapshotDone comes 1.5 TTLs after its snapshot, as
	// a loaded NATS R3 cluster took about that long to set one up: an
	// ephemeral key written before the watch expires before the rule's
	// next write, which then creates it again, and the watch delivers
	// the expiry's delete first.
	{name: "key-watch-ready-after-a-ttl", wrap: func(sh *shared, s *mem.Store) spate.Store {
		return &keyWatching{hooked: &hooked{Store: s}, wk: func(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
			in, err := s.WatchKeys(ctx, ks, keys)
			if err != nil {
				return nil, err
			}
			out := make(chan spate.WatchEvent)
			go func() {
				defer close(out)
				for ev := range in {
					if ev.Kind == spate.WatchSnapshotDone && !sh.sleep(ttl*3/2) {
						return
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
	// The process stalls once for 1.5 TTLs, before the first guarded
	// delete of a live ephemeral key, as a NATS R3 cluster beside two
	// busy processes stalled ValidKeysAreAccepted between an update and
	// its delete: the key expires, and the delete at its revision loses.
	{name: "a-stall-before-a-delete-past-a-ttl-once", wrap: func(sh *shared, s *mem.Store) spate.Store {
		return &hooked{Store: s, del: func(ctx context.Context, ks spate.Keyspace, k string, exp uint64) (spate.Outcome, error) {
			if _, live, err := s.Get(ctx, ks, k); err == nil && live && ks == spate.Ephemeral && exp != spate.AnyRevision {
				sh.mu.Lock()
				stall := !sh.stalled
				sh.stalled = true
				sh.mu.Unlock()
				if stall && !sh.sleep(ttl*3/2) {
					return spate.Outcome{}, spate.Retryablef("the store closed")
				}
			}
			return s.Delete(ctx, ks, k, exp)
		}}
	}},
}

func TestTimedRulesPassASlowStore(t *testing.T) {
	if os.Getenv("SPATE_MUTANT") != "" {
		t.Skip("inside a mutant run")
	}
	for name, rules := range map[string][]string{
		"round-trips-of-100ms":                    {"WatchHasNoGaps", "WatchKeysHasNoGaps", "ListNeverUnderReports"},
		"snapshot-read-key-by-key":                {"WatchHasNoGaps"},
		"key-watch-ready-after-a-ttl":             {"WatchKeysWatchesARepeatedKeyOnce"},
		"a-stall-past-a-ttl-once":                 {"ValueCapIsReported", "OutcomeReportsWhetherTheWriteApplied"},
		"a-stall-before-a-delete-past-a-ttl-once": {"ValidKeysAreAccepted"},
	} {
		t.Run(name, func(t *testing.T) {
			failed := catch(t, conformance.CheckStore, mutantHarness(slowMutants, name), rules)
			require.Empty(t, failed, "%s keeps the contract, yet rules failed:\n%s", name, verdicts(failed))
		})
	}
}
