// Command pgcopy copies a PostgreSQL table into another, exactly once, as
// one worker of a fleet: run it on as many machines as you like against one
// coordination store.
//
//	go run ./examples/pgcopy -db postgres://user@host/db -src events -dst events_copy -store redis://host:6379
package main

import (
	"context"
	"errors"
	"flag"
	"log"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/pgsink"
	"github.com/spate-go/spate/pipeline/pgsource"
	_ "github.com/spate-go/spate/stores/etcd"
	_ "github.com/spate-go/spate/stores/mem"
	_ "github.com/spate-go/spate/stores/nats"
	_ "github.com/spate-go/spate/stores/redis"
	"github.com/spate-go/spate/storeurl"
)

func main() {
	db, srcT, dstT := flag.String("db", "", "postgres:// URL"), flag.String("src", "", "source table"), flag.String("dst", "", "destination table")
	store := flag.String("store", "mem://", "coordination store URL")
	flag.Parse()
	if err := copyTable(context.Background(), *store, *db, *srcT, *dstT); err != nil {
		log.Fatal(err)
	}
}

// copyTable is the whole job: the user's code a table copy needs.
func copyTable(ctx context.Context, store, db, srcTable, dstTable string) error {
	st, err := storeurl.OpenStore(ctx, store, "copy-"+srcTable, 10*time.Second, storeurl.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	coord, err := spate.NewStoreCoordinator(st, spate.TimingsForLease(10*time.Second))
	if err != nil {
		return err
	}
	defer coord.Close()
	src, err := pgsource.New(ctx, pgsource.Options{URL: db, Table: srcTable})
	if err != nil {
		return err
	}
	sink, err := pgsink.New(ctx, pgsink.Options{URL: db, Table: dstTable, Job: "copy-" + srcTable, Shape: src.Table().Columns})
	if err != nil {
		return err
	}
	defer sink.Close()
	rt, err := pipeline.Build(pipeline.Config{Name: coord.InstanceID()}, pipeline.NewCoordinatedSource(coord, src, src),
		nil, []pipeline.SinkSpec{{Name: "table", Sink: sink}})
	if err != nil {
		return err
	}
	rep, err := rt.Run(ctx)
	return errors.Join(err, rep.Err())
}
