package blobsource_test

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	_ "gocloud.dev/blob/fileblob"
	"gocloud.dev/blob/memblob"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesource"
	"github.com/spate-go/spate/pipeline/filesource/blobsource"
	"github.com/spate-go/spate/stores/mem"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// writeDir writes files under dir and returns every line as "name:offset" → line.
func writeDir(t *testing.T, dir string, files map[string]string) map[string]string {
	t.Helper()
	lines := map[string]string{}
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
		off := 0
		for _, l := range strings.SplitAfter(content, "\n") {
			if l == "" {
				continue
			}
			lines[fmt.Sprintf("%s:%d", name, off)] = strings.TrimSuffix(l, "\n")
			off += len(l)
		}
	}
	return lines
}

var corpus = map[string]string{
	"2026/01/a.log": "alpha\nbeta\n",
	"2026/01/b.log": "gamma\n\ndelta",
	"2026/02/c.log": "",
	"top.log":       strings.Repeat("x\n", 100),
}

// A directory read through fileblob plans exactly as the same directory
// read directly: same members, same split ids. So a job's splits do not
// depend on how its input is reached.
func TestBucketPlansLikeTheDirectory(t *testing.T) {
	dir := t.TempDir()
	writeDir(t, dir, corpus)
	objs, closeBucket, err := blobsource.OpenURL(t.Context(), "file://"+filepath.ToSlash(dir))
	require.NoError(t, err)
	defer closeBucket()
	fromBucket, err := objs.List(t.Context())
	require.NoError(t, err)
	fromDir, err := filesource.Dir(dir).List(t.Context())
	require.NoError(t, err)
	require.Equal(t, fromDir, fromBucket, "bucket listing %+v\ndirectory listing %+v", fromBucket, fromDir)
	a, _ := filesource.SplitFor(fromBucket)
	b, _ := filesource.SplitFor(fromDir)
	require.Equal(t, b.ID, a.ID, "split ids differ: %s vs %s", a.ID, b.ID)
}

func TestOpenReadsFromAnOffsetAndReportsMissingObjects(t *testing.T) {
	b := memblob.OpenBucket(nil)
	defer b.Close()
	require.NoError(t, b.WriteAll(t.Context(), "k", []byte("0123456789"), nil))
	objs := blobsource.New(b, "mem://test")
	r, size, err := objs.Open(t.Context(), "k", 4)
	require.NoError(t, err)
	got, _ := io.ReadAll(r)
	r.Close()
	require.Equal(t, "456789", string(got), "read %q size %d", got, size)
	require.Equal(t, int64(10), size, "read %q size %d", got, size)
	_, _, err = objs.Open(t.Context(), "absent", 0)
	require.ErrorIs(t, err, fs.ErrNotExist, "a missing object")
}

func TestOpenURL(t *testing.T) {
	_, _, err := blobsource.OpenURL(t.Context(), "no-scheme-here")
	require.True(t, spate.IsFatal(err), "a path without a scheme: %v, want Fatal", err)
	_, _, err = blobsource.OpenURL(t.Context(), "nosuchscheme://bucket")
	require.True(t, spate.IsFatal(err), "an unknown scheme: %v, want a Fatal error naming it", err)
	require.ErrorContains(t, err, "nosuchscheme", "an unknown scheme: want a Fatal error naming it")
	dir := t.TempDir()
	u := "file://" + filepath.ToSlash(dir) + "?prefix=" + url.QueryEscape("logs/") + "&metadata=skip"
	objs, closeBucket, err := blobsource.OpenURL(t.Context(), u)
	require.NoError(t, err)
	defer closeBucket()
	want := "file://" + filepath.ToSlash(dir) + "?prefix=logs/"
	require.Equal(t, want, objs.Location(), "location %q, want %q (no options but the prefix)", objs.Location(), want)
}

// A coordinated backfill of a bucket over the in-memory store delivers
// every line of every object, keyed as a directory backfill keys them.
func TestCoordinatedBackfillOfABucket(t *testing.T) {
	b := memblob.OpenBucket(nil)
	defer b.Close()
	dir := t.TempDir()
	want := writeDir(t, dir, corpus)
	for name, content := range corpus {
		require.NoError(t, b.WriteAll(t.Context(), name, []byte(content), nil))
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	store := mem.MustNew(mem.Options{TTL: time.Second})
	defer store.Close()
	coord, err := spate.NewStoreCoordinator(store, spate.Config{
		InstanceID: "w1", LeaseDuration: time.Second, OpTimeout: 100 * time.Millisecond,
		ReplanInterval: time.Second, ReconcileInterval: 100 * time.Millisecond, RebalanceDelay: spate.NoRebalanceDelay,
	}, spate.WithLogger(quiet))
	require.NoError(t, err)
	defer coord.Close()
	sink := &pipeline.CaptureSink{}
	rt, err := pipeline.Build(pipeline.Config{Name: "bucket", CommitInterval: 20 * time.Millisecond},
		filesource.New(blobsource.New(b, "mem://corpus"), coord, filesource.PlannerOptions{TargetBytes: 64, MaxFiles: 2}), nil,
		[]pipeline.SinkSpec{{Name: "capture", Sink: sink, Options: pipeline.SinkOptions{Linger: time.Millisecond}}},
		pipeline.WithLogger(quiet))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	report, err := rt.Run(ctx)
	require.NoError(t, err, "run: %v", report.State)
	require.Equal(t, pipeline.Completed, report.State, "run: %v %v", report.State, err)
	got := map[string]string{}
	for _, r := range sink.Records() {
		if prev, dup := got[string(r.Key)]; dup {
			require.Equal(t, prev, string(r.Value), "%s delivered twice with different lines", r.Key)
		}
		got[string(r.Key)] = string(r.Value)
	}
	require.Len(t, got, len(want), "delivered %d distinct lines, want %d", len(got), len(want))
	for k, v := range want {
		require.Equal(t, v, got[k], "line %s = %q, want %q", k, got[k], v)
	}
}
