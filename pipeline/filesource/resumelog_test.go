package filesource_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesink"
	"github.com/spate-go/spate/pipeline/filesource"
	"github.com/spate-go/spate/stores/mem"
)

// lockedBuffer is a log destination shared by goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A resume check that rejects a changed input file is told to the
// operator once per rejection: the coordinator's line that fails the split
// names the file and its sizes. The pipeline logged the same error a
// second time as a "retryable source control-plane error", which named no
// split and read like a store fault.
func TestResumeRejectionIsLoggedOnce(t *testing.T) {
	in := t.TempDir()
	corpus(t, in, map[string]string{"a.log": numbered("a", 40), "c.log": numbered("c", 40)})
	popts := filesource.PlannerOptions{MaxFiles: 1}
	store := mem.MustNew(mem.Options{TTL: e2eLease})
	defer store.Close()
	lineEnd := int64(len(numbered("a", 20)))
	seedProgress(t, store, in, popts, map[string]int64{"a.log": lineEnd})
	require.NoError(t, os.Truncate(filepath.Join(in, "a.log"), lineEnd-10))

	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	coord, err := spate.NewStoreCoordinator(store, e2eConfig("taker", 4), spate.WithLogger(log))
	require.NoError(t, err)
	defer coord.Close()
	out, err := filesink.NewFileSink(filepath.Join(t.TempDir(), "taker"), "out")
	require.NoError(t, err)
	defer out.Close()
	pcfg := testConfig()
	pcfg.Name = "taker"
	pcfg.DrainTimeout = time.Second
	rt, err := pipeline.Build(pcfg, filesource.New(filesource.Dir(in), coord, popts), nil,
		[]pipeline.SinkSpec{{Name: "file", Sink: out, Options: sinkOpts()}}, pipeline.WithLogger(log))
	require.NoError(t, err)
	done := make(chan pipeline.ExitReport, 1)
	go func() {
		r, _ := rt.Run(context.Background())
		done <- r
	}()
	var r pipeline.ExitReport
	select {
	case r = <-done:
	case <-time.After(60 * time.Second):
		require.FailNow(t, "the worker did not finish", "log:\n%s", logs.String())
	}
	require.Equal(t, pipeline.Failed, r.State, "report %+v", r)
	require.ErrorContains(t, r.Failure, "stalled", "report %+v", r)

	snap, err := spate.InspectJob(context.Background(), store, "")
	require.NoError(t, err)
	var attempts int
	for _, s := range snap.Splits {
		if s.Status == spate.StatusQuarantined {
			attempts = int(s.Attempts)
		}
	}
	require.Positive(t, attempts, "no split was quarantined:\n%s", logs.String())

	text := logs.String()
	require.NotContains(t, text, "retryable source control-plane error", "a resume rejection was logged twice")
	sizes := "a.log is " + itoa(int(lineEnd-10)) + " bytes now, " + itoa(len(numbered("a", 40))) + " when planned"
	var named []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, "a.log") {
			named = append(named, line)
		}
	}
	require.Len(t, named, attempts, "one line per rejection; the lines naming a.log:\n%s", strings.Join(named, "\n"))
	for _, line := range named {
		require.Contains(t, line, "level=WARN")
		require.Contains(t, line, "split failed by the source")
		require.Contains(t, line, sizes)
	}
}
