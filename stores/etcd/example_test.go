package etcd_test

import (
	"context"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/etcdservers"
	"github.com/spate-go/spate/stores/etcd"
)

// endpoints are your cluster's client URLs; the examples run against an
// embedded server.
func endpoints() []string {
	c, err := etcdservers.SharedCluster()
	if err != nil {
		log.Fatal(err)
	}
	return c.Endpoints()
}

// A fenced progress commit: compare-and-swap at the revision last seen.
func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close() // the application owns the client

	ctx := context.Background()
	store, err := etcd.New(ctx, cli, etcd.Options{Prefix: "/spate/example-job/", TTL: 2 * time.Second})
	if err != nil {
		log.Fatal(err) // Fatal: fix the configuration; Retryable: try again
	}
	defer store.Close()

	created, err := store.Create(ctx, spate.Durable, "split.a", []byte(`{"offset":0}`))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("created:", created.Won)
	again, _ := store.Create(ctx, spate.Durable, "split.a", []byte(`{"offset":0}`))
	fmt.Println("created twice:", again.Won)

	commit, _ := store.Update(ctx, spate.Durable, "split.a", []byte(`{"offset":100}`), created.Revision)
	fmt.Println("commit at the revision we saw:", commit.Won)
	zombie, _ := store.Update(ctx, spate.Durable, "split.a", []byte(`{"offset":50}`), created.Revision)
	fmt.Println("commit at a stale revision:", zombie.Won)

	e, _, _ := store.Get(ctx, spate.Durable, "split.a")
	fmt.Println("progress:", string(e.Value))

	lease, _ := store.Create(ctx, spate.Ephemeral, "lease.a", []byte("worker-1"))
	fmt.Println("lease held:", lease.Won)

	c := store.Capabilities()
	fmt.Println(c.Driver, "TTL", c.TTL, "linearizable across failover:", c.LinearizableFailover)

	_, _ = store.Delete(ctx, spate.Durable, "split.a", spate.AnyRevision)
	_, _ = store.Delete(ctx, spate.Ephemeral, "lease.a", spate.AnyRevision)
	// Output:
	// created: true
	// created twice: false
	// commit at the revision we saw: true
	// commit at a stale revision: false
	// progress: {"offset":100}
	// lease held: true
	// etcd TTL 2s linearizable across failover: true
}
