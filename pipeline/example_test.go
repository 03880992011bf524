package pipeline_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesource"
	"github.com/spate-go/spate/stores/mem"
)

// A job assembled from a source, three stages and a sink: a coordinated
// backfill of a directory (one instance, an in-memory store) through a
// flat-map that splits lines into words, a filter that skips "beta" and a
// map to upper case, into a capture sink. The run ends by itself once every
// split is completed, and its Completed exit means every record was
// acknowledged and committed.
func ExampleBuild() {
	in, _ := os.MkdirTemp("", "in")
	defer os.RemoveAll(in)
	_ = os.WriteFile(filepath.Join(in, "a.log"), []byte("alpha beta\ngamma\n"), 0o644)
	_ = os.WriteFile(filepath.Join(in, "b.log"), []byte("delta\n"), 0o644)

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

	stages := []pipeline.Stage{
		pipeline.FlatMap("words", pipeline.Fail, func(r pipeline.Record, emit func(pipeline.Record)) error {
			for _, w := range strings.Fields(string(r.Value)) {
				out := r
				out.Value = []byte(w)
				emit(out)
			}
			return nil
		}),
		pipeline.Filter("no-beta", pipeline.Skip, func(r pipeline.Record) (bool, error) {
			return string(r.Value) != "beta", nil
		}),
		pipeline.Map("upper", pipeline.Fail, func(r pipeline.Record) (pipeline.Record, error) {
			r.Value = bytes.ToUpper(r.Value)
			return r, nil
		}),
	}
	sink := &pipeline.CaptureSink{}
	rt, err := pipeline.Build(pipeline.Config{Name: "words", CommitInterval: 50 * time.Millisecond},
		filesource.New(filesource.Dir(in), coord, filesource.PlannerOptions{}), stages,
		[]pipeline.SinkSpec{{Name: "capture", Sink: sink, Options: pipeline.SinkOptions{Linger: time.Millisecond}}},
		pipeline.WithLogger(quiet))
	if err != nil {
		panic(err)
	}
	report, err := rt.Run(context.Background())
	fmt.Println(report.State, err)
	var words []string
	for _, r := range sink.Records() {
		words = append(words, string(r.Value))
	}
	slices.Sort(words) // the files' lines may arrive in any order
	fmt.Println(words)
	// Output:
	// completed <nil>
	// [ALPHA DELTA GAMMA]
}
