package filesource_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesource"
)

// flakyObjects fails every failEvery-th Open and cuts every reader with an
// error after cutAfter bytes: a bucket whose connections drop.
type flakyObjects struct {
	filesource.Objects
	failEvery, cutAfter int

	mu    sync.Mutex
	opens int
}

func (f *flakyObjects) Open(ctx context.Context, name string, offset int64) (io.ReadCloser, int64, error) {
	f.mu.Lock()
	f.opens++
	n := f.opens
	f.mu.Unlock()
	if f.failEvery > 0 && n%f.failEvery == 0 {
		return nil, 0, errors.New("connection reset by peer")
	}
	r, size, err := f.Objects.Open(ctx, name, offset)
	if err != nil || f.cutAfter == 0 {
		return r, size, err
	}
	return &cutReader{ReadCloser: r, left: f.cutAfter}, size, nil
}

type cutReader struct {
	io.ReadCloser
	left int
}

func (c *cutReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, io.ErrUnexpectedEOF
	}
	if len(p) > c.left {
		p = p[:c.left]
	}
	n, err := c.ReadCloser.Read(p)
	c.left -= n
	return n, err
}

func keys(ps []pipeline.RawPayload) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = string(p.Key) + "=" + string(p.Value)
	}
	return out
}

// Dropped connections (failed opens, streams cut mid-line) are ridden out:
// the lane reopens at the start of the line it was reading, so every line
// comes out once, whole, in order, and the split is not poisoned.
func TestTransientReadErrorsAreRetried(t *testing.T) {
	dir := t.TempDir()
	genCorpus(t, dir, 6, 40, 7)
	members, err := filesource.ListFiles(context.Background(), dir)
	require.NoError(t, err)
	spec, err := filesource.SplitFor(members)
	require.NoError(t, err)
	clean := filesource.NewSource(filesource.Dir(dir))
	want := keys(readUntilDone(t, clean, spec.ID, openLane(t, clean, spec, nil, pipeline.NewCheckpointer(nil), nil), 3))
	longest := 0
	for _, k := range want {
		longest = max(longest, len(k))
	}
	flaky := &flakyObjects{Objects: filesource.Dir(dir), failEvery: 3, cutAfter: 2*longest + 17}
	src := filesource.NewSource(flaky)
	got := keys(readUntilDone(t, src, spec.ID, openLane(t, src, spec, nil, pipeline.NewCheckpointer(nil), nil), 3))
	require.True(t, slices.Equal(got, want), "through a flaky input the lane read %d lines, want the same %d as a clean read", len(got), len(want))
	require.GreaterOrEqual(t, flaky.opens, 2*len(members), "only %d opens: the faults were not exercised", flaky.opens)
}

// An input that never answers is poison after a bounded number of tries,
// and the report says why.
func TestPersistentReadErrorsArePoison(t *testing.T) {
	dir := t.TempDir()
	corpus(t, dir, map[string]string{"a": "x\ny\n"})
	members, _ := filesource.ListFiles(context.Background(), dir)
	spec, _ := filesource.SplitFor(members)
	src := filesource.NewSource(&flakyObjects{Objects: filesource.Dir(dir), failEvery: 1})
	var reasons []string
	l := openLane(t, src, spec, nil, pipeline.NewCheckpointer(nil), func(r string) { reasons = append(reasons, r) })
	got := readUntilDone(t, src, spec.ID, l, 10)
	require.Empty(t, got, "read %d lines from an input that never opens", len(got))
	require.Len(t, reasons, 1, "poison reasons %q", reasons)
	require.Contains(t, reasons[0], "in a row failed", "poison reasons %q", reasons)
	require.Contains(t, reasons[0], "connection reset", "poison reasons %q", reasons)
}

// A file that shrank after planning is poison (not retried forever, and
// its cut-off tail is not emitted as a line).
func TestShrunkFileIsPoison(t *testing.T) {
	dir := t.TempDir()
	corpus(t, dir, map[string]string{"a": "one\ntwo\nthree\n"})
	members, _ := filesource.ListFiles(context.Background(), dir)
	spec, _ := filesource.SplitFor(members)
	require.NoError(t, os.Truncate(filepath.Join(dir, "a"), 6))
	src := filesource.NewSource(filesource.Dir(dir))
	var reasons []string
	l := openLane(t, src, spec, nil, pipeline.NewCheckpointer(nil), func(r string) { reasons = append(reasons, r) })
	got := keys(readUntilDone(t, src, spec.ID, l, 10))
	require.Empty(t, got, "emitted %q from a file that no longer matches its plan", got)
	require.Len(t, reasons, 1, "poison reasons %q", reasons)
	require.Contains(t, reasons[0], "planned 14", "poison reasons %q", reasons)
}

// A file that shrinks while its lane reads it (past what the lane has
// buffered): the lines before the cut come out, the cut-off tail does not,
// and the split is poison.
func TestFileShrinkingMidReadIsPoison(t *testing.T) {
	dir := t.TempDir()
	var sb strings.Builder
	for i := range 80000 {
		fmt.Fprintf(&sb, "line-%05d\n", i) // 11 bytes a line, 880 kB: several read buffers
	}
	corpus(t, dir, map[string]string{"a": sb.String()})
	members, _ := filesource.ListFiles(context.Background(), dir)
	spec, _ := filesource.SplitFor(members)
	src := filesource.NewSource(filesource.Dir(dir))
	var reasons []string
	l := openLane(t, src, spec, nil, pipeline.NewCheckpointer(nil), func(r string) { reasons = append(reasons, r) })
	b, err := l.Poll(1, 0)
	require.NoError(t, err, "first poll: %v", b)
	require.NotNil(t, b, "first poll: %v %v", b, err)
	require.Equal(t, "line-00000", string(b.Payloads[0].Value), "first poll: %v %v", b, err)
	b.Ack.Release()
	require.NoError(t, os.Truncate(filepath.Join(dir, "a"), 600000+3)) // inside line 54545
	got := readUntilDone(t, src, spec.ID, l, 500)
	require.NotEmpty(t, got, "the buffered lines before the cut were not emitted")
	for _, p := range got {
		require.Len(t, p.Value, len("line-00000"), "the cut-off tail %q was emitted as a line", p.Value)
	}
	last := string(got[len(got)-1].Value)
	require.Less(t, last, "line-54545", "read up to %s, past the cut", last)
	require.Len(t, reasons, 1, "poison reasons %q", reasons)
	require.Contains(t, reasons[0], "planned 880000", "poison reasons %q", reasons)
}
