package filesource_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesource"
)

// A lane cuts its lines out of a reused read buffer: lines of every
// length (longer than the buffer too), lines across read boundaries, a
// last line without a newline, empty lines and empty files all come out
// whole and in order, with the right keys and offsets, whatever the poll
// size; and a batch stays intact until the next poll, however much the
// poll read.
func TestLaneCutsEveryLineWholeFromItsBuffer(t *testing.T) {
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(4, 2))
	files := map[string]string{}
	type line struct{ key, value string }
	var want []line
	names := []string{"a", "b/c", "d", "e", "f"}
	for fi, name := range names {
		var sb strings.Builder
		n := 0
		switch fi {
		case 1:
			n = 0 // an empty file
		case 2:
			n = 3 // with a line longer than a read buffer
		default:
			n = 2000 + r.IntN(3000)
		}
		for i := range n {
			var v string
			switch {
			case fi == 2 && i == 1:
				v = strings.Repeat("L", 700<<10)
			case r.IntN(50) == 0 && (fi != 4 || i != n-1):
				v = "" // an empty line (not last in f, which has no newline)
			default:
				v = strings.Repeat(strconv.Itoa(i%10), 1+r.IntN(300))
			}
			want = append(want, line{key: name + ":" + strconv.Itoa(sb.Len()), value: v})
			sb.WriteString(v)
			if fi != 4 || i != n-1 { // f's last line has no newline
				sb.WriteByte('\n')
			}
		}
		files[name] = sb.String()
	}
	corpus(t, dir, files)
	members, err := filesource.ListFiles(context.Background(), dir)
	require.NoError(t, err)
	spec, err := filesource.SplitFor(members)
	require.NoError(t, err)
	for _, max := range []int{1, 7, 512, 1 << 20} {
		t.Run(fmt.Sprint("max=", max), func(t *testing.T) {
			src := filesource.NewSource(filesource.Dir(dir))
			l := openLane(t, src, spec, nil, pipeline.NewCheckpointer(nil), nil)
			i := 0
			var offset int64
			for polls := 0; ; polls++ {
				require.LessOrEqual(t, polls, 1_000_000, "lane never ended")
				b, err := l.Poll(max, 0)
				require.NoError(t, err)
				if b == nil {
					if !src.Unfinished(spec.ID) {
						break
					}
					continue
				}
				require.LessOrEqual(t, len(b.Payloads), max, "a poll of at most %d returned %d lines", max, len(b.Payloads))
				// Checked before the next poll, which may reuse the memory.
				for _, p := range b.Payloads {
					require.Less(t, i, len(want), "more lines than the %d written", len(want))
					require.Equal(t, want[i].key, string(p.Key), "line %d: %q (%d bytes), want %q (%d bytes)", i, p.Key, len(p.Value), want[i].key, len(want[i].value))
					// True, not Equal: a value can be 700 KiB, too long to print.
					require.True(t, string(p.Value) == want[i].value, "line %d: %q (%d bytes), want %q (%d bytes)", i, p.Key, len(p.Value), want[i].key, len(want[i].value))
					offset += int64(len(p.Value)) + 1
					if i == len(want)-1 {
						offset-- // no newline
					}
					require.Equal(t, offset-1, p.Offset, "line %d: offset %d, want %d", i, p.Offset, offset-1)
					i++
				}
				b.Ack.Release()
			}
			require.Equal(t, len(want), i, "read %d lines, want %d", i, len(want))
		})
	}
}
