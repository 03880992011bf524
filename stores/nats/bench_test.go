package nats_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/natstest"
	spatenats "github.com/spate-go/spate/stores/nats"
)

// benchValue is about the size of a progress record.
var benchValue = bytes.Repeat([]byte{'v'}, 256)

// BenchmarkRawKVUpdate is the floor a fenced commit is measured against:
// a compare-and-swap loop with the jetstream KV API (Update at the revision
// the previous Update returned) on one embedded server, file storage, R1.
func BenchmarkRawKVUpdate(b *testing.B) {
	srv := natstest.Start(b)
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
	srv := natstest.Start(b)
	nc := srv.Connect(b)
	ctx := context.Background()
	s, err := spatenats.New(ctx, nc, spatenats.Options{Job: natstest.NewJob(), TTL: ttl})
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

// BenchmarkStoreUpdateWatched is BenchmarkStoreUpdate with a watch of the
// durable keyspace open on the same store, read as a coordinator's would
// be: every update is also delivered back to its writer. A fenced commit
// pays this; the raw KV loop does not.
func BenchmarkStoreUpdateWatched(b *testing.B) {
	srv := natstest.Start(b)
	nc := srv.Connect(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := spatenats.New(ctx, nc, spatenats.Options{Job: natstest.NewJob(), TTL: ttl})
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
	srv := natstest.Start(b)
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
