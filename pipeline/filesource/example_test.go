package filesource_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesource"
	"github.com/spate-go/spate/stores/mem"
)

// A coordinated backfill of a directory into a file sink, on one instance
// over an in-memory store. The run ends by itself once every split is
// completed.
func Example() {
	in, _ := os.MkdirTemp("", "in")
	out, _ := os.MkdirTemp("", "out")
	defer os.RemoveAll(in)
	defer os.RemoveAll(out)
	_ = os.WriteFile(filepath.Join(in, "a.log"), []byte("alpha\nbeta\n"), 0o644)
	_ = os.WriteFile(filepath.Join(in, "b.log"), []byte("gamma\n"), 0o644)

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	store := mem.MustNew(mem.Options{TTL: time.Second})
	defer store.Close()
	coord, err := spate.NewStoreCoordinator(store, spate.Config{
		InstanceID: "worker-1", LeaseDuration: time.Second, OpTimeout: 100 * time.Millisecond,
		ReplanInterval: time.Second, ReconcileInterval: 100 * time.Millisecond, RebalanceDelay: spate.NoRebalanceDelay,
	}, spate.WithLogger(quiet))
	if err != nil {
		panic(err)
	}
	defer coord.Close()

	sink, _ := pipeline.NewFileSink(out, "lines")
	defer sink.Close()
	rt, err := pipeline.Build(pipeline.Config{Name: "backfill", CommitInterval: 50 * time.Millisecond},
		filesource.New(filesource.Dir(in), coord, filesource.PlannerOptions{}), nil,
		[]pipeline.SinkSpec{{Name: "file", Sink: sink, Options: pipeline.SinkOptions{Linger: 5 * time.Millisecond}}},
		pipeline.WithLogger(quiet))
	if err != nil {
		panic(err)
	}
	report, err := rt.Run(context.Background())
	fmt.Println(report.State, err)

	f, _ := os.Open(sink.Path(0))
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fmt.Println(sc.Text())
	}
	// Output:
	// completed <nil>
	// a.log:0	alpha
	// a.log:6	beta
	// b.log:0	gamma
}
