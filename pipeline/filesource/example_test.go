package filesource_test

import (
	"bufio"
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
	"github.com/spate-go/spate/pipeline/filesink"
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

	sink, _ := filesink.NewFileSink(out, "lines")
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

// A continuous job: the directory is followed. A line appended to a.log
// while the job runs, and a file created in the directory, are copied
// too; once the input has been idle for UntilIdle the plan turns final,
// each followed file is read to its end, and the run completes. The
// staged file sink publishes each split's lines to OUT/<split>.out,
// exactly once.
func Example_follow() {
	in, _ := os.MkdirTemp("", "in")
	out, _ := os.MkdirTemp("", "out")
	defer os.RemoveAll(in)
	defer os.RemoveAll(out)
	_ = os.WriteFile(filepath.Join(in, "a.log"), []byte("alpha\n"), 0o644)

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	store := mem.MustNew(mem.Options{TTL: time.Second})
	defer store.Close()
	coord, err := spate.NewStoreCoordinator(store, spate.Config{
		InstanceID: "worker-1", LeaseDuration: time.Second, OpTimeout: 100 * time.Millisecond,
		// An open plan is planned again every ReplanInterval: new files
		// are found that often.
		ReplanInterval: time.Second, ReconcileInterval: 100 * time.Millisecond, RebalanceDelay: spate.NoRebalanceDelay,
	}, spate.WithLogger(quiet))
	if err != nil {
		panic(err)
	}
	defer coord.Close()

	sink, _ := filesink.NewStagedFileSink(out, "follow")
	defer sink.Close()
	objs := filesource.Dir(in)
	src := pipeline.NewCoordinatedSource(coord, filesource.NewSource(objs).WithLogger(quiet),
		filesource.NewPlanner(objs, filesource.PlannerOptions{Follow: true, UntilIdle: time.Second}))
	rt, err := pipeline.Build(pipeline.Config{Name: "follow", CommitInterval: 50 * time.Millisecond}, src, nil,
		[]pipeline.SinkSpec{{Name: "file", Sink: sink, Options: pipeline.SinkOptions{Linger: 5 * time.Millisecond}}},
		pipeline.WithLogger(quiet))
	if err != nil {
		panic(err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		f, _ := os.OpenFile(filepath.Join(in, "a.log"), os.O_APPEND|os.O_WRONLY, 0)
		_, _ = f.WriteString("beta\n")
		_ = f.Close()
		_ = os.WriteFile(filepath.Join(in, "b.log"), []byte("gamma\n"), 0o644)
	}()
	report, err := rt.Run(context.Background())
	fmt.Println(report.State, err)

	var lines []string
	outs, _ := filepath.Glob(filepath.Join(out, "*.out"))
	for _, path := range outs {
		data, _ := os.ReadFile(path)
		lines = append(lines, strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")...)
	}
	slices.Sort(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// completed <nil>
	// a.log:0	alpha
	// a.log:6	beta
	// b.log:0	gamma
}
