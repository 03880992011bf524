package redis_test

import (
	"context"
	"fmt"
	"log"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/redis"
)

// Open a job's store on a Redis server, commit with compare-and-swap, and
// close. The client belongs to the caller, who closes it after the store.
// (Not run by go test: it needs a server on localhost:6379.)
func Example() {
	ctx := context.Background()
	client := goredis.NewClient(&goredis.Options{
		Addr:                  "localhost:6379",
		Username:              "spate",
		Password:              "secret",
		ContextTimeoutEnabled: true, // let context deadlines bound socket I/O
	})
	defer client.Close()

	st, err := redis.New(ctx, client, redis.Options{Job: "backfill-2026", TTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err) // Fatal: fix the server or ACL; Retryable: try again later
	}
	defer st.Close()

	o, err := st.Create(ctx, spate.Durable, "split.a", []byte(`{"watermark":0}`))
	if err != nil {
		log.Fatal(err)
	}
	o, err = st.Update(ctx, spate.Durable, "split.a", []byte(`{"watermark":100}`), o.Revision)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("committed:", o.Won)
	fmt.Println(st.Capabilities().LinearizableFailover)
}
