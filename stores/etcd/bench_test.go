package etcd_test

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/etcdservers"
	"github.com/spate-go/spate/stores/etcd"
)

// BenchmarkRawTxnCAS is the floor for a fenced commit: one clientv3
// transaction that puts a key only at the revision last written, in a loop,
// on the shared embedded server. Pair it with the coordinator's commit
// benchmark in the same run; the ratio is the overhead spate adds.
func BenchmarkRawTxnCAS(b *testing.B) {
	cli := etcdservers.Shared(b).Client(b, nil)
	ctx := context.Background()
	key := etcdservers.FreshPrefix() + "durable/bench.raw"
	put, err := cli.Put(ctx, key, "0")
	if err != nil {
		b.Fatal(err)
	}
	rev := put.Header.Revision
	for b.Loop() {
		resp, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, "progress")).
			Commit()
		if err != nil {
			b.Fatal(err)
		}
		if !resp.Succeeded {
			b.Fatalf("CAS at revision %d lost", rev)
		}
		rev = resp.Header.Revision
	}
}

// BenchmarkStoreUpdate is the same compare-and-swap through the driver, on
// each keyspace: durable is one transaction; ephemeral adds a lease grant
// (and a background revocation of the superseded lease).
func BenchmarkStoreUpdate(b *testing.B) {
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		b.Run(ks.String(), func(b *testing.B) {
			cli := etcdservers.Shared(b).Client(b, nil)
			s, err := etcd.New(context.Background(), cli, etcd.Options{Prefix: etcdservers.FreshPrefix(), TTL: testTTL})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = s.Close() })
			ctx := context.Background()
			o, err := s.Create(ctx, ks, "bench.store", []byte("0"))
			if err != nil || !o.Won {
				b.Fatalf("create: won=%t err=%v", o.Won, err)
			}
			rev := o.Revision
			for b.Loop() {
				u, err := s.Update(ctx, ks, "bench.store", []byte("progress"), rev)
				if err != nil {
					b.Fatal(err)
				}
				if !u.Won {
					b.Fatalf("CAS at revision %d lost", rev)
				}
				rev = u.Revision
			}
		})
	}
}
