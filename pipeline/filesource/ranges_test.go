package filesource_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesource"
)

// The descriptors and ids of whole-file splits are what they were before
// files could be divided into ranges: a job planned by an earlier build
// keeps its splits (values computed by the build before ranges).
func TestWholeFileSplitIDsAndDescriptorsAreUnchanged(t *testing.T) {
	ms := []filesource.Member{{Name: "a/b.log", Size: 10, MTime: 1}, {Name: "c\xff", Size: 300, MTime: 1700000000000000000}}
	for _, c := range []struct {
		members  []filesource.Member
		id, desc string
		weight   uint64
	}{
		{ms[:1], "f1Y7-4EM4OLt1ycmdqytoA6Q", `{"v":1,"files":[{"name":"a/b.log","size":10,"mtime":1}]}`, 10},
		{ms, "f1su54F4rfcVOIPBhqSGNegQ", `{"v":1,"files":[{"name":"a/b.log","size":10,"mtime":1},{"name_b64":"Y/8=","size":300,"mtime":1700000000000000000}]}`, 310},
	} {
		spec, err := filesource.SplitFor(c.members)
		require.NoError(t, err)
		require.Equal(t, c.id, spec.ID.String())
		require.Equal(t, c.desc, string(spec.Descriptor))
		require.Equal(t, c.weight, spec.Weight)
	}
	// Below the target, a plan at the defaults is these whole-file splits.
	specs, err := filesource.PlanSplits(ms, 64<<20, 16, filesource.DefaultMinSplits)
	require.NoError(t, err)
	require.Len(t, specs, 1)
	require.Equal(t, "f1su54F4rfcVOIPBhqSGNegQ", specs[0].ID.String())
}

// expectedLines is every line of content: its key (name and the byte
// offset of its first byte) and value.
func expectedLines(name, content string) []string {
	var out []string
	for off := 0; off < len(content); {
		end := strings.IndexByte(content[off:], '\n')
		next := off + end + 1
		if end < 0 {
			end, next = len(content)-off, len(content)
		}
		out = append(out, name+":"+strconv.Itoa(off)+"\t"+content[off:off+end])
		off = next
	}
	return out
}

// readRange reads a split's lane to its end and reports its lines, and
// whether the source completes the split once they are all acknowledged.
func readRange(t require.TestingT, src *filesource.Source, spec spate.SplitSpec, progress *spate.SplitProgress, max int) (lines []string, offsets []int64, completed bool) {
	cp := pipeline.NewCheckpointer(nil)
	l, err := src.OpenSplit(pipeline.SplitOpening{Spec: spec, Progress: progress, Issuer: cp.Issuer(), Waker: spate.InertWaker(),
		Poison: func(r string) { t.Errorf("poison: %s", r) }})
	require.NoError(t, err)
	defer src.CloseSplit(spec.ID)
	for polls := 0; ; polls++ {
		require.Less(t, polls, 100000, "lane never ended")
		b, err := l.Poll(max, 0)
		require.NoError(t, err)
		if b == nil {
			if !src.Unfinished(spec.ID) {
				break
			}
			continue
		}
		for _, p := range b.Payloads {
			lines = append(lines, string(p.Key)+"\t"+string(bytes.Clone(p.Value)))
			offsets = append(offsets, p.Offset)
		}
		b.Ack.Release()
	}
	if len(offsets) > 0 {
		p, err := src.EncodeCommit(spec.ID, offsets[len(offsets)-1]+1)
		require.NoError(t, err)
		return lines, offsets, p.Completed
	}
	p, err := src.Sweep(spec.ID)
	require.NoError(t, err)
	return lines, offsets, p != nil && p.Completed
}

// The ranges of a divided file read every line exactly once, in order,
// with the keys of the whole file, whatever the line lengths: lines that
// cross range ends, ranges in which no line starts, lines longer than a
// range, CRLF line ends, no trailing newline; every range completes; and
// a range resumed at any of its committed watermarks reads exactly the
// rest of its lines.
func TestRangesReadEveryLineExactlyOnce(t *testing.T) {
	root := t.TempDir()
	run := 0
	rapid.Check(t, func(rt *rapid.T) {
		run++
		dir := filepath.Join(root, strconv.Itoa(run))
		require.NoError(rt, os.MkdirAll(dir, 0o755))
		// Short and long lines, empty lines, CR before LF, and maybe no
		// newline at the end.
		parts := rapid.SliceOfN(rapid.SampledFrom([]string{"a", "bb", "\n", "\n", "\r\n", strings.Repeat("L", 40), ""}), 0, 60).Draw(rt, "parts")
		content := strings.Join(parts, "")
		name := "x.log"
		require.NoError(rt, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
		members, err := filesource.ListFiles(context.Background(), dir)
		require.NoError(rt, err)
		target := rapid.Int64Range(1, 64).Draw(rt, "target")
		specs, err := filesource.PlanSplits(members, target, 16, 1)
		require.NoError(rt, err)
		max := rapid.IntRange(1, 4).Draw(rt, "max")
		src := filesource.NewSource(filesource.Dir(dir))
		var got []string
		var next int64 // the file offset the next range starts at
		for _, spec := range specs {
			d, err := filesource.DecodeDescriptor(spec.Descriptor)
			require.NoError(rt, err)
			start := int64(0)
			if d.Range != nil {
				start = d.Range.Start
				require.Equal(rt, next, start, "ranges must tile the file")
				next = d.Range.End
			} else {
				next = d.Total()
			}
			lines, offsets, completed := readRange(rt, src, spec, nil, max)
			require.True(rt, completed, "split %s (%s) did not complete", spec.ID, spec.Descriptor)
			got = append(got, lines...)
			for i, off := range offsets {
				// The offset is range-relative: the line's last byte.
				key, value, _ := strings.Cut(lines[i], "\t")
				first, _ := strconv.ParseInt(key[strings.LastIndexByte(key, ':')+1:], 10, 64)
				last := first + int64(len(value))
				if int(last) == len(content) {
					last-- // the file's last line, without a newline
				}
				require.Equal(rt, last-start, off, "line %q of range %s", lines[i], spec.Descriptor)
			}
			// Resume at every watermark the range could have committed.
			for i := range offsets {
				wm := spate.NewSplitProgress(offsets[i]+1, nil)
				require.NoError(rt, src.ValidateResume(spec, wm), "resume at %d of %s", wm.Watermark, spec.Descriptor)
				rest, _, completed := readRange(rt, src, spec, &wm, max)
				require.Equal(rt, append([]string(nil), lines[i+1:]...), rest, "resumed at %d of %s", wm.Watermark, spec.Descriptor)
				require.True(rt, completed)
			}
		}
		require.Equal(rt, int64(len(content)), next, "the ranges must end at the file's end")
		require.Equal(rt, expectedLines(name, content), got)
	})
}

// A large file becomes line-aligned ranges; a range's descriptor names
// its bounds and is refused when malformed.
func TestRangeDescriptors(t *testing.T) {
	m := filesource.Member{Name: "big", Size: 100, MTime: 7}
	require.Equal(t, []filesource.Range{{Start: 0, End: 33}, {Start: 33, End: 66}, {Start: 66, End: 100}}, filesource.Ranges(100, 40))
	require.Equal(t, []filesource.Range{{Start: 0, End: 100}}, filesource.Ranges(100, 100))
	specs, err := filesource.PlanSplits([]filesource.Member{m}, 40, 16, 1)
	require.NoError(t, err)
	require.Len(t, specs, 3)
	again, err := filesource.PlanSplits([]filesource.Member{m}, 40, 16, 1)
	require.NoError(t, err)
	seen := map[spate.SplitID]bool{}
	for i, s := range specs {
		require.Equal(t, again[i].ID, s.ID, "range ids are deterministic")
		require.False(t, seen[s.ID], "range ids are distinct")
		seen[s.ID] = true
		d, err := filesource.DecodeDescriptor(s.Descriptor)
		require.NoError(t, err)
		require.Equal(t, filesource.RangeVersion, d.Version)
		require.Equal(t, uint64(d.Total()), s.Weight)
	}
	require.Equal(t, `{"v":2,"files":[{"name":"big","size":100,"mtime":7}],"range":{"start":33,"end":66}}`, string(specs[1].Descriptor))
	for _, bad := range []string{
		`{"v":2,"files":[{"name":"big","size":100,"mtime":7}]}`,
		`{"v":1,"files":[{"name":"big","size":100,"mtime":7}],"range":{"start":0,"end":50}}`,
		`{"v":2,"files":[{"name":"big","size":100,"mtime":7}],"range":{"start":50,"end":50}}`,
		`{"v":2,"files":[{"name":"big","size":100,"mtime":7}],"range":{"start":50,"end":101}}`,
		`{"v":2,"files":[{"name":"a","size":100,"mtime":7},{"name":"b","size":100,"mtime":7}],"range":{"start":150,"end":201}}`,
		`{"v":2,"files":[],"range":{"start":0,"end":1}}`,
		`{"v":3,"files":[{"name":"big","size":100,"mtime":7}],"range":{"start":0,"end":50}}`,
	} {
		_, err := filesource.DecodeDescriptor([]byte(bad))
		require.True(t, spate.IsFatal(err), "descriptor %s: %v, want Fatal", bad, err)
	} // A runtime division's range runs over the members concatenated.
	d, err := filesource.DecodeDescriptor([]byte(`{"v":2,"files":[{"name":"a","size":100,"mtime":7},{"name":"b","size":100,"mtime":7}],"range":{"start":50,"end":200}}`))
	require.NoError(t, err)
	require.EqualValues(t, 150, d.Total())
}

// The minimum split count: an input of many small files, or of one large
// file and a few small ones, is planned into at least DefaultMinSplits
// splits at the defaults (the old packing made 2 and 3), none larger than
// its share; a small input is not cut below MinSplitBytes a split; and
// the count stays bounded.
func TestPlanMakesAtLeastMinSplits(t *testing.T) {
	const mib = 1 << 20
	equal := make([]filesource.Member, 24)
	for i := range equal {
		equal[i] = filesource.Member{Name: fmt.Sprintf("f%02d", i), Size: mib / 4, MTime: 1}
	}
	skewed := []filesource.Member{{Name: "big", Size: 5 * mib, MTime: 1}}
	for i := range 20 {
		skewed = append(skewed, filesource.Member{Name: fmt.Sprintf("s%02d", i), Size: 50 << 10, MTime: 1})
	}
	many := make([]filesource.Member, 1000)
	for i := range many {
		many[i] = filesource.Member{Name: fmt.Sprintf("m%04d", i), Size: 47 * mib / 1000, MTime: 1}
	}
	for _, c := range []struct {
		name     string
		members  []filesource.Member
		min, max int
	}{
		{"24 equal files", equal, filesource.DefaultMinSplits, 2 * filesource.DefaultMinSplits},
		{"one big file and 20 small", skewed, filesource.DefaultMinSplits, 2 * filesource.DefaultMinSplits},
		{"1000 files", many, 1000 / 16, 1000/16 + 2*filesource.DefaultMinSplits},
		{"a small input", []filesource.Member{{Name: "a", Size: 16 << 10}, {Name: "b", Size: 16 << 10}, {Name: "c", Size: 16 << 10}}, 1, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			specs, err := filesource.PlanSplits(c.members, 64*mib, 16, filesource.DefaultMinSplits)
			require.NoError(t, err)
			require.GreaterOrEqual(t, len(specs), c.min)
			require.LessOrEqual(t, len(specs), c.max)
			var total, planned int64
			for _, m := range c.members {
				total += m.Size
			}
			share := filesource.Target(total, 64*mib, filesource.DefaultMinSplits)
			for _, s := range specs {
				planned += int64(s.Weight)
				require.LessOrEqual(t, int64(s.Weight), share, "split %s", s.Descriptor)
			}
			require.Equal(t, total, planned, "the splits must cover the input's bytes")
		})
	}
	// MinSplits 1 is the old packing.
	specs, err := filesource.PlanSplits(equal, 64*mib, 16, 1)
	require.NoError(t, err)
	require.Len(t, specs, 2)
}

// A job's identity at the default MinSplits is what an earlier build
// derived (so its stored plan is resumed); another MinSplits is another
// job.
func TestFingerprintNamesOnlyANonDefaultMinSplits(t *testing.T) {
	objs := filesource.Dir("/in")
	const old = "filesource:v1:/in:target=67108864:files=16"
	require.Equal(t, old, filesource.NewPlanner(objs, filesource.PlannerOptions{}).Fingerprint())
	require.Equal(t, old, filesource.NewPlanner(objs, filesource.PlannerOptions{MinSplits: filesource.DefaultMinSplits}).Fingerprint())
	require.Equal(t, old+":min=1", filesource.NewPlanner(objs, filesource.PlannerOptions{MinSplits: 1}).Fingerprint())
}
