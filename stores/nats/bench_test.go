package nats_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/natsservers"
	spatenats "github.com/spate-go/spate/stores/nats"
)

// benchValue is about the size of a progress record.
var benchValue = bytes.Repeat([]byte{'v'}, 256)

// BenchmarkRawKVUpdate is the floor a fenced commit is measured against:
// a compare-and-swap loop with the jetstream KV API (Update at the revision
// the previous Update returned) on one embedded server, file storage, R1.
func BenchmarkRawKVUpdate(b *testing.B) {
	srv := natsservers.Start(b)
	nc := srv.Connect(b)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "bench_raw", Storage: jetstream.FileStorage})
	if err != nil {
		b.Fatal(err)
	}
	rev, err := kv.Create(ctx, "split.bench", benchValue)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if rev, err = kv.Update(ctx, "split.bench", benchValue, rev); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStoreUpdate is the same loop through the driver's Update on the
// durable keyspace: the driver's own overhead over the raw KV call.
func BenchmarkStoreUpdate(b *testing.B) {
	srv := natsservers.Start(b)
	nc := srv.Connect(b)
	ctx := context.Background()
	s, err := spatenats.New(ctx, nc, spatenats.Options{Job: natsservers.NewJob(), TTL: ttl})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	o, err := s.Create(ctx, spate.Durable, "split.bench", benchValue)
	if err != nil || !o.Won {
		b.Fatalf("create: %v", err)
	}
	rev := o.Revision
	for b.Loop() {
		o, err := s.Update(ctx, spate.Durable, "split.bench", benchValue, rev)
		if err != nil || !o.Won {
			b.Fatalf("update: won=%t err=%v", o.Won, err)
		}
		rev = o.Revision
	}
}

// BenchmarkWatchKeys opens a key watch of n keys on a durable bucket of
// 4096 live keys (the listed ones among them) and reads its snapshot, on
// one embedded server: the cost of establishing a watch, next to a prefix
// watch of the whole bucket.
//
//	go test -run '^$' -bench 'WatchKeys' ./stores/nats
func BenchmarkWatchKeys(b *testing.B) {
	srv := natsservers.Start(b)
	nc := srv.Connect(b)
	ctx := context.Background()
	s, err := spatenats.New(ctx, nc, spatenats.Options{Job: natsservers.NewJob(), TTL: ttl})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	const bucket = 4096
	keys := make([]string, bucket)
	for i := range keys {
		keys[i] = fmt.Sprintf("split.%05d", i)
		if o, err := s.Create(ctx, spate.Durable, keys[i], benchValue); err != nil || !o.Won {
			b.Fatalf("create: %v", err)
		}
	}
	snapshot := func(b *testing.B, open func(context.Context) (<-chan spate.WatchEvent, error), want int) {
		for b.Loop() {
			wctx, cancel := context.WithCancel(ctx)
			ch, err := open(wctx)
			if err != nil {
				b.Fatal(err)
			}
			n := 0
			for ev := range ch {
				if ev.Kind == spate.WatchSnapshotDone {
					break
				}
				if ev.Kind != spate.WatchPut {
					b.Fatalf("snapshot: %v %v", ev.Kind, ev.Err)
				}
				n++
			}
			cancel()
			for range ch {
			}
			if n != want {
				b.Fatalf("snapshot of %d puts, want %d", n, want)
			}
		}
	}
	for _, n := range []int{1, 64, spate.MaxWatchKeys} {
		// Every fourth key, so that the server skips unlisted subjects.
		listed := make([]string, n)
		for i := range listed {
			listed[i] = keys[4*i]
		}
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			snapshot(b, func(ctx context.Context) (<-chan spate.WatchEvent, error) {
				return s.WatchKeys(ctx, spate.Durable, listed)
			}, n)
		})
	}
	b.Run(fmt.Sprintf("prefix-of-%d", bucket), func(b *testing.B) {
		snapshot(b, func(ctx context.Context) (<-chan spate.WatchEvent, error) {
			return s.Watch(ctx, spate.Durable, "split.")
		}, bucket)
	})
}

// BenchmarkStoreUpdateWatched is BenchmarkStoreUpdate with a watch of the
// durable keyspace open on the same store, read as a coordinator's would
// be: every update is also delivered back to its writer. A fenced commit
// pays this; the raw KV loop does not.
func BenchmarkStoreUpdateWatched(b *testing.B) {
	srv := natsservers.Start(b)
	nc := srv.Connect(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := spatenats.New(ctx, nc, spatenats.Options{Job: natsservers.NewJob(), TTL: ttl})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	o, err := s.Create(ctx, spate.Durable, "split.bench", benchValue)
	if err != nil || !o.Won {
		b.Fatalf("create: %v", err)
	}
	ch, err := s.Watch(ctx, spate.Durable, "")
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		for range ch {
		}
	}()
	rev := o.Revision
	for b.Loop() {
		o, err := s.Update(ctx, spate.Durable, "split.bench", benchValue, rev)
		if err != nil || !o.Won {
			b.Fatalf("update: won=%t err=%v", o.Won, err)
		}
		rev = o.Revision
	}
}

// BenchmarkRawKVUpdateWatched is BenchmarkRawKVUpdate with an ordered
// consumer of the bucket drained on the same connection: what JetStream
// itself charges a writer that also watches.
func BenchmarkRawKVUpdateWatched(b *testing.B) {
	srv := natsservers.Start(b)
	nc := srv.Connect(b)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "bench_raw", Storage: jetstream.FileStorage})
	if err != nil {
		b.Fatal(err)
	}
	rev, err := kv.Create(ctx, "split.bench", benchValue)
	if err != nil {
		b.Fatal(err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	go func() {
		for range w.Updates() {
		}
	}()
	for b.Loop() {
		if rev, err = kv.Update(ctx, "split.bench", benchValue, rev); err != nil {
			b.Fatal(err)
		}
	}
}
