package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/pipeline/filesource"
)

// wholeLines is what verify computed before it streamed: each line read
// whole, its newline cut, and hashed; with cut, the text after the first
// tab, and whether there is one.
func wholeLines(t *testing.T, in string, cut bool) (hashes []uint64, heads []string, tabs []bool) {
	t.Helper()
	br := bufio.NewReader(strings.NewReader(in))
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			line = bytes.TrimSuffix(line, []byte{'\n'})
			head, value, ok := bytes.Cut(line, []byte{'\t'})
			if !cut {
				value = line
			}
			hashes, heads, tabs = append(hashes, lineHash(value)), append(heads, string(head)), append(tabs, ok)
		}
		if err == io.EOF {
			return
		}
		require.NoError(t, err)
	}
}

// The streaming line reader of verify sees every line, its head and its
// hash as reading whole lines does, lines longer than its buffer too.
func TestVerifyLineStreamMatchesWholeLines(t *testing.T) {
	long := strings.Repeat("v", 700<<10)
	for _, in := range []string{
		"",
		"a\n",
		"a",
		"\n\n",
		"k:1\tvalue\nk:2\tv\tw\nnotab\n\tx\n",
		"k:1\t" + long + "\nk:2\t" + long,
		strings.Repeat("k", 300<<10) + "\tv\n" + long + "\n",
		strings.Repeat("k", 250<<10) + "\t" + long + "\n" + strings.Repeat("k", maxKeyBytes) + "\tv",
	} {
		for _, cut := range []bool{false, true} {
			hashes, heads, tabs := wholeLines(t, in, cut)
			ls := newLineStream(strings.NewReader(in))
			var n int64
			for i := 0; ; i++ {
				l, err := ls.next(cut)
				if err == io.EOF {
					require.Equal(t, len(hashes), i, "lines")
					break
				}
				require.NoError(t, err)
				require.Less(t, i, len(hashes), "more lines than there are")
				require.Equal(t, hashes[i], l.hash, "line %d's hash (cut %v)", i, cut)
				if cut {
					// A head longer than a key can be is malformed.
					require.Equal(t, tabs[i] && len(heads[i]) <= maxKeyBytes, l.cut, "line %d has a tab and a key", i)
					if l.cut {
						require.Equal(t, heads[i], string(l.head), "line %d's head", i)
					}
				}
				n += l.n
			}
			require.Equal(t, int64(len(in)), n, "bytes")
		}
	}
	// A head longer than a key can be is malformed, not held.
	l, err := newLineStream(strings.NewReader(strings.Repeat("k", maxKeyBytes+1) + "\tv\n")).next(true)
	require.NoError(t, err)
	require.False(t, l.cut)
}

// lineOf streams one line of n bytes (prefix, then 'x's, then a newline)
// without holding it.
type lineOf struct {
	prefix string
	n, at  int64
}

func (r *lineOf) Read(p []byte) (int, error) {
	if r.at > r.n {
		return 0, io.EOF
	}
	i := 0
	for ; i < len(p) && r.at <= r.n; i, r.at = i+1, r.at+1 {
		switch {
		case r.at < int64(len(r.prefix)):
			p[i] = r.prefix[r.at]
		case r.at == r.n:
			p[i] = '\n'
		default:
			p[i] = 'x'
		}
	}
	return i, nil
}

func (r *lineOf) Close() error { return nil }

// oneLine is an input of one file holding a lineOf.
type oneLine struct {
	filesource.Objects
	n int64
}

func (o oneLine) Open(context.Context, string, int64) (io.ReadCloser, int64, error) {
	return &lineOf{n: o.n}, o.n + 1, nil
}

// allocated is what f allocates on the heap.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// spate verify's memory does not grow with the length of a line: a 64 MiB
// line, of the input or of the output, is hashed as it streams by (it was
// held whole, several times over while its buffer grew).
func TestVerifyMemoryIsBoundedWhateverTheLineLength(t *testing.T) {
	const n = 64 << 20
	var lines []outLine
	var err error
	a := allocated(func() { lines, err = inputLines(context.Background(), oneLine{n: n}, "long.log") })
	require.NoError(t, err)
	require.Len(t, lines, 1)
	require.Less(t, a, uint64(8<<20), "input: %d bytes allocated for a %d-byte line", a, n)

	seen := map[string][]outLine{}
	var r verifyResult
	a = allocated(func() { err = scanOutput("x.out", &lineOf{prefix: "long.log:0\t", n: n}, seen, &r) })
	require.NoError(t, err)
	require.Equal(t, int64(1), r.OutputLines)
	require.Len(t, seen["long.log"], 1)
	require.Less(t, a, uint64(8<<20), "output: %d bytes allocated for a %d-byte line", a, n)
}

// verify compares names as bytes: a file whose name is not valid UTF-8,
// beside the file of its mangled name, is verified against the output
// lines that name it, and a line naming the wrong one is caught.
func TestVerifyNamesThatAreNotUTF8(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	const bad, twin = "bad-\xff.log", "bad-\uFFFD.log"
	require.NoError(t, os.WriteFile(filepath.Join(src, bad), []byte("one\ntwo\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(src, twin), []byte("three\n"), 0o644))
	out := filepath.Join(dst, "f1x.out")
	require.NoError(t, os.WriteFile(out, []byte(bad+":0\tone\n"+bad+":4\ttwo\n"+twin+":0\tthree\n"), 0o644))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := verifyOutput(ctx, filesource.Dir(src), &destination{location: dst, dir: dst})
	require.NoError(t, err)
	require.True(t, r.OK(), "%s", r.report())

	require.NoError(t, os.WriteFile(out, []byte(twin+":0\tone\n"+bad+":4\ttwo\n"+twin+":0\tthree\n"), 0o644))
	r, err = verifyOutput(ctx, filesource.Dir(src), &destination{location: dst, dir: dst})
	require.NoError(t, err)
	require.False(t, r.OK(), "%s", r.report())
	require.Equal(t, int64(1), r.Missing, "%s", r.report())
}
