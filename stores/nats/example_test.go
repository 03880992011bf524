package nats_test

import (
	"context"
	"fmt"
	"log"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/spate-go/spate"
	spatenats "github.com/spate-go/spate/stores/nats"
)

// A production store: R3 file-storage buckets over a connection the caller
// owns. The servers run nats-server >= 2.11 with
// `jetstream { sync_interval: always }`.
func ExampleNew() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := spatenats.Connect(ctx, "nats://n1:4222,nats://n2:4222,nats://n3:4222",
		natsgo.UserCredentials("/etc/spate/worker.creds"),
		natsgo.MaxReconnects(-1))
	if err != nil {
		// Fatal: bad credentials, TLS or credentials file; Retryable:
		// the servers are unreachable for now.
		log.Fatalf("connect (retryable %t): %v", spate.IsRetryable(err), err)
	}
	defer nc.Close()
	store, err := spatenats.New(ctx, nc, spatenats.Options{
		Job:      "backfill-2025-q3",
		TTL:      15 * time.Second,
		Replicas: 3,
	})
	if err != nil {
		log.Fatalf("open (retryable %t): %v", spate.IsRetryable(err), err)
	}
	defer store.Close()
	fmt.Println(store.Capabilities().LinearizableFailover)
}
