package redis_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/redisservers"
)

// benchValue is about the size of a progress record.
var benchValue = bytes.Repeat([]byte("p"), 256)

// BenchmarkRawScriptCAS is the floor: one bare compare-and-swap script per
// operation (no revision mint, no change log), on a spawned server.
func BenchmarkRawScriptCAS(b *testing.B) {
	srv := redisservers.Start(b)
	c := srv.Client(b)
	cas, err := redisservers.NewRawCAS(b.Context(), c, "bench:{raw}:k")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := cas.Swap(b.Context(), benchValue); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStoreUpdate is the driver's compare-and-swap on the same kind of
// server: check, write, revision mint and change-log append in one script.
func BenchmarkStoreUpdate(b *testing.B) {
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		b.Run(ks.String(), func(b *testing.B) {
			srv := redisservers.Start(b)
			st, err := srv.NewHarness(b, testTTL).Open(b.Context())
			if err != nil {
				b.Fatal(err)
			}
			o, err := st.Create(b.Context(), ks, "bench.k", benchValue)
			if err != nil || !o.Won {
				b.Fatalf("create: %v", err)
			}
			rev := o.Revision
			for b.Loop() {
				o, err := st.Update(b.Context(), ks, "bench.k", benchValue, rev)
				if err != nil || !o.Won {
					b.Fatalf("update at %d: won=%t err=%v", rev, o.Won, err)
				}
				rev = o.Revision
			}
		})
	}
}

// BenchmarkStoreUpdateWatched is BenchmarkStoreUpdate on the durable
// keyspace with n watches of it open on the same store, each drained as it
// goes: what the watchers cost a writer, on the server and in the client
// (each watch must see every write before the benchmark ends).
func BenchmarkStoreUpdateWatched(b *testing.B) {
	for _, n := range []int{1, 16} {
		b.Run(fmt.Sprintf("watches=%d", n), func(b *testing.B) {
			srv := redisservers.Start(b)
			st, err := srv.NewHarness(b, testTTL).Open(b.Context())
			if err != nil {
				b.Fatal(err)
			}
			o, err := st.Create(b.Context(), spate.Durable, "bench.k", benchValue)
			if err != nil || !o.Won {
				b.Fatalf("create: %v", err)
			}
			rev := o.Revision
			ctx, cancel := context.WithCancel(b.Context())
			defer cancel()
			seen := make([]atomic.Uint64, n)
			var wg sync.WaitGroup
			for i := range n {
				ch, err := st.Watch(ctx, spate.Durable, "")
				if err != nil {
					b.Fatal(err)
				}
				wg.Go(func() {
					for ev := range ch {
						if ev.Kind == spate.WatchError {
							b.Errorf("watch %d: %v", i, ev.Err)
						}
						seen[i].Store(ev.Revision)
					}
				})
			}
			b.ResetTimer()
			for range b.N {
				o, err := st.Update(b.Context(), spate.Durable, "bench.k", benchValue, rev)
				if err != nil || !o.Won {
					b.Fatalf("update at %d: won=%t err=%v", rev, o.Won, err)
				}
				rev = o.Revision
			}
			for i := range seen {
				for seen[i].Load() < rev {
					time.Sleep(100 * time.Microsecond)
				}
			}
			b.StopTimer()
			cancel()
			wg.Wait()
		})
	}
}
