package filesource_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesource"
)

// A range whose last line ends beyond the range's end completes where
// that line ends (EncodeCommit). Sweep, which completes a split whose
// every byte is acknowledged, must complete it there too, not at the
// range's end: when the completing commit's reply was lost (a store
// timeout under load), the sweep's commit of the lower watermark moved
// the split's committed watermark back, and the coordinator stopped the
// worker Fatal ("would move its committed watermark back from 31660 to
// 31611", spate backfill beside busy processes).
func TestSweepCompletesARangeWhereItsLastLineEnds(t *testing.T) {
	dir := t.TempDir()
	content := strings.Repeat("0123456789\n", 10) // 110 bytes, a line every 11
	require.NoError(t, os.WriteFile(filepath.Join(dir, "x.log"), []byte(content), 0o644))
	members, err := filesource.ListFiles(context.Background(), dir)
	require.NoError(t, err)
	specs, err := filesource.PlanSplits(members, 40, 16, 1)
	require.NoError(t, err)
	require.Greater(t, len(specs), 1)
	spec := specs[0]
	d, err := filesource.DecodeDescriptor(spec.Descriptor)
	require.NoError(t, err)
	require.NotNil(t, d.Range)
	total := d.Range.End - d.Range.Start
	require.NotZero(t, total%11, "the range must end inside a line: %+v", d.Range)

	src := filesource.NewSource(filesource.Dir(dir))
	cp := pipeline.NewCheckpointer(nil)
	l, err := src.OpenSplit(pipeline.SplitOpening{Spec: spec, Issuer: cp.Issuer(), Waker: spate.InertWaker(),
		Poison: func(r string) { t.Errorf("poison: %s", r) }})
	require.NoError(t, err)
	defer src.CloseSplit(spec.ID)
	var last int64 = -1
	for polls := 0; ; polls++ {
		require.Less(t, polls, 1000, "lane never ended")
		b, err := l.Poll(100, 0)
		require.NoError(t, err)
		if b == nil {
			if !src.Unfinished(spec.ID) {
				break
			}
			continue
		}
		for _, p := range b.Payloads {
			last = p.Offset
		}
		b.Ack.Release()
	}
	p, err := src.EncodeCommit(spec.ID, last+1)
	require.NoError(t, err)
	require.True(t, p.Completed)
	require.Greater(t, p.Watermark, total, "the range's last line ends beyond its end")
	// The completing commit did not report back; the sweep completes the
	// split again.
	sw, err := src.Sweep(spec.ID)
	require.NoError(t, err)
	require.NotNil(t, sw, "every byte of the split is acknowledged")
	require.True(t, sw.Completed)
	require.Equal(t, p.Watermark, sw.Watermark, "the sweep completes the range below the watermark its completion carried")
}
