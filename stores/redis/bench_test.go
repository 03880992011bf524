package redis_test

import (
	"bytes"
	"testing"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/redistest"
)

// benchValue is about the size of a progress record.
var benchValue = bytes.Repeat([]byte("p"), 256)

// BenchmarkRawScriptCAS is the floor: one bare compare-and-swap script per
// operation (no revision mint, no change log), on a spawned server.
func BenchmarkRawScriptCAS(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	cas, err := redistest.NewRawCAS(b.Context(), c, "bench:{raw}:k")
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
			srv := redistest.Start(b)
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
