package pipeline_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesink"
)

// The file sink writes one line per record and is durable before it acks.
func TestFileSinkWritesLines(t *testing.T) {
	dir := t.TempDir()
	fs, err := filesink.NewFileSink(dir, "out")
	require.NoError(t, err)
	defer fs.Close()
	var src *fakeSource
	src = newFakeSource(&eventLog{}, assign(lane(0, 0, 3), lane(1, 1, 3)),
		waitUntil(func() bool { o0, _ := src.committed(0); o1, _ := src.committed(1); return o0 == 30 && o1 == 30 }),
		drained())
	_, wait := startReal(t, testConfig(), src, nil, nil, pipeline.SinkSpec{Name: "file", Sink: fs, Options: realSinkOptions()})
	r := wait()
	require.Equal(t, pipeline.Completed, r.State, "failure: %v", r.Failure)
	lines := 0
	for shard := range 2 {
		f, err := os.Open(fs.Path(shard))
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			require.True(t, strings.HasPrefix(sc.Text(), "\tv"), "line %q", sc.Text())
			lines++
		}
		f.Close()
	}
	require.Equal(t, 60, lines)
}

// A write larger than FileSink's buffer goes out in pieces: every line of
// every chunk lands once, in order, and a second write appends after it.
func TestFileSinkWritesLargeBatchesInOrder(t *testing.T) {
	fs, err := filesink.NewFileSink(t.TempDir(), "big")
	require.NoError(t, err)
	defer fs.Close()
	value := bytes.Repeat([]byte("x"), 300)
	batch := func(first, n int) [][]pipeline.Record {
		var chunks [][]pipeline.Record
		for off := first; off < first+n; off += 1000 {
			var c []pipeline.Record
			for o := off; o < min(off+1000, first+n); o++ {
				c = append(c, pipeline.Record{Key: []byte(strconv.Itoa(o)), Value: value, Offset: int64(o)})
			}
			chunks = append(chunks, c)
		}
		return chunks
	}
	// About 1.5 MiB and then 0.3 MiB of lines: several pieces each.
	require.NoError(t, fs.WriteChunks(t.Context(), 0, batch(0, 5000)))
	require.NoError(t, fs.WriteChunks(t.Context(), 0, batch(5000, 1000)))
	data, err := os.ReadFile(fs.Path(0))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	require.Len(t, lines, 6000)
	for i, line := range lines {
		require.Equal(t, strconv.Itoa(i)+"\t"+string(value), line, "line %d", i)
	}
}

// CaptureSink's Fail hook decides a write before anything is kept; what it
// keeps is a copy (the runtime reuses the records' bytes after Write), and
// Records hands out a copy of its list.
func TestCaptureSinkKeepsCopiesAndHonoursFail(t *testing.T) {
	refuse := errors.New("refused")
	c := &pipeline.CaptureSink{Fail: func(shard int, _ []pipeline.Record) error {
		if shard == 1 {
			return refuse
		}
		return nil
	}}
	value := []byte("v1")
	recs := []pipeline.Record{{Key: []byte("k"), Value: value, Offset: 1}}
	require.NoError(t, c.Write(t.Context(), 0, recs))
	require.ErrorIs(t, c.Write(t.Context(), 1, recs), refuse)
	assert.Equal(t, 2, c.Writes(), "a failed write is a write")
	assert.Equal(t, 1, c.Len(), "a failed write keeps nothing")

	value[0] = 'X' // the runtime reuses its arena
	got := c.Records()
	require.Len(t, got, 1)
	assert.Equal(t, "v1", string(got[0].Value), "the sink kept a copy of the bytes")
	got[0] = pipeline.Record{}
	assert.Equal(t, "v1", string(c.Records()[0].Value), "Records returns a copy of the list")

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	assert.ErrorIs(t, c.Write(ctx, 0, recs), context.Canceled)
	assert.Equal(t, 2, c.Writes(), "a cancelled write is not attempted")
}
