package filesource_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesource"
	"github.com/spate-go/spate/stores/mem"
)

// badName is a file name that is not valid UTF-8; mangledName is what a
// JSON string makes of it (its 0xff byte becomes U+FFFD).
const (
	badName     = "bad-\xff.log"
	mangledName = "bad-\uFFFD.log"
)

// numbered is n lines of text naming tag.
func numbered(tag string, n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(tag)
		b.WriteString(" line ")
		b.WriteString(strings.Repeat("x", i%7))
		b.WriteByte('\n')
	}
	return b.String()
}

// runToEnd runs one worker over in until it ends and returns its report
// and its output's lines by key.
func runToEnd(t *testing.T, in string, popts filesource.PlannerOptions) (pipeline.ExitReport, map[string]int) {
	t.Helper()
	store := mem.MustNew(mem.Options{TTL: e2eLease})
	defer store.Close()
	w := startWorkerWith(t, "only", store, in, popts, 64, nil)
	r := w.wait(t)
	return r, outputLines(t, w.out, 2)
}

// A file name that is not valid UTF-8 round-trips byte for byte through
// the plan (the descriptor is JSON): the file is read, alone or beside a
// file named as a JSON string would mangle its name, and every line of
// every file is delivered exactly once.
func TestNamesThatAreNotUTF8AreReadByteForByte(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
	}{
		{"alone", map[string]string{"a.log": numbered("a", 50), badName: numbered("bad", 100), "c.log": numbered("c", 30)}},
		{"beside its mangled twin", map[string]string{"a.log": numbered("a", 50), badName: numbered("bad", 100), mangledName: numbered("twin", 87)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := t.TempDir()
			lines := corpus(t, in, tc.files)
			// One split holds them all, as the defaults pack small files.
			r, seen := runToEnd(t, in, filesource.PlannerOptions{})
			require.Equal(t, pipeline.Completed, r.State, "report %+v", r)
			missing, dups, alien := exactlyOnce(lines, seen)
			require.Zero(t, missing, "lines missing from the output")
			require.Zero(t, dups, "duplicate lines in the output")
			require.Zero(t, alien, "lines in the output that are not in the input")
			require.Equal(t, 100, countPrefix(seen, badName+":"), "lines of %q", badName)
		})
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func countPrefix(seen map[string]int, prefix string) int {
	n := 0
	for k, c := range seen {
		if strings.HasPrefix(k, prefix) {
			n += c
		}
	}
	return n
}

// The name encoding: a valid name's descriptor is what it always was
// (existing plans keep their descriptors and ids), a name that is not
// valid UTF-8 is carried in name_b64 and decodes to its exact bytes, and
// a split's id is derived from the names' bytes.
func TestDescriptorNamesRoundTrip(t *testing.T) {
	valid := []filesource.Member{{Name: "a/b.log", Size: 10, MTime: 1}}
	spec, err := filesource.SplitFor(valid)
	require.NoError(t, err)
	require.JSONEq(t, `{"v":1,"files":[{"name":"a/b.log","size":10,"mtime":1}]}`, string(spec.Descriptor))
	require.Equal(t, `{"v":1,"files":[{"name":"a/b.log","size":10,"mtime":1}]}`, string(spec.Descriptor))
	require.Equal(t, "f1Y7-4EM4OLt1ycmdqytoA6Q", spec.ID.String(), "a valid name's split id changed: existing plans would be orphaned")

	bad := []filesource.Member{{Name: "d/" + badName, Size: 3, MTime: 2}, {Name: "d/" + mangledName, Size: 4, MTime: 2}}
	spec, err = filesource.SplitFor(bad)
	require.NoError(t, err)
	require.Contains(t, string(spec.Descriptor), `"name_b64":"ZC9iYWQt/y5sb2c="`)
	d, err := filesource.DecodeDescriptor(spec.Descriptor)
	require.NoError(t, err)
	require.Equal(t, bad, d.Files, "names must round-trip byte for byte")
	again, err := filesource.SplitFor(bad)
	require.NoError(t, err)
	require.Equal(t, spec.ID, again.ID, "split ids are deterministic")
	require.Equal(t, string(spec.Descriptor), string(again.Descriptor))
	twin, err := filesource.SplitFor([]filesource.Member{{Name: "d/" + mangledName, Size: 3, MTime: 2}})
	require.NoError(t, err)
	alone, err := filesource.SplitFor(bad[:1])
	require.NoError(t, err)
	require.NotEqual(t, twin.ID, alone.ID, "a name and its mangled form are different files")

	tail, err := filesource.TailSplitFor(filesource.Member{Name: badName, Size: 1}, filesource.FileID{Dev: 1, Ino: 2})
	require.NoError(t, err)
	d, err = filesource.DecodeDescriptor(tail.Descriptor)
	require.NoError(t, err)
	require.Equal(t, badName, d.Tail.Name)
	require.Equal(t, filesource.FileID{Dev: 1, Ino: 2}, d.Tail.FileID)

	for _, refused := range []string{
		`{"v":1,"files":[{"name":"a","name_b64":"YQ==","size":1,"mtime":0}]}`,
		`{"v":1,"files":[{"name_b64":"not base64!","size":1,"mtime":0}]}`,
	} {
		_, err := filesource.DecodeDescriptor([]byte(refused))
		require.True(t, spate.IsFatal(err), "descriptor %s: %v, want Fatal", refused, err)
	}
	var m filesource.Member
	require.NoError(t, json.Unmarshal([]byte(`{"name":"x","size":1,"mtime":0}`), &m))
	require.Equal(t, filesource.Member{Name: "x", Size: 1}, m)
}

// seedProgress commits, as a worker that then left would have, each
// split's watermark to the store: the splits are keyed by the first file
// they hold.
func seedProgress(t *testing.T, store spate.Store, in string, popts filesource.PlannerOptions, at map[string]int64) {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	coord, err := spate.NewStoreCoordinator(store, e2eConfig("seeder", 64), spate.WithLogger(quiet))
	require.NoError(t, err)
	defer coord.Close()
	waker := spate.NewWaker()
	coord.SetWaker(waker)
	require.NoError(t, coord.Start(filesource.NewPlanner(filesource.Dir(in), popts)))
	gained := map[string]spate.Gained{}
	waitFor(t, "the seeder to gain its splits", func() bool {
		select {
		case <-waker.C():
		case <-time.After(20 * time.Millisecond):
		}
		events, err := coord.Poll()
		require.NoError(t, err)
		for _, ev := range events {
			if g, ok := ev.(spate.Gained); ok {
				d, err := filesource.DecodeDescriptor(g.Split.Descriptor)
				require.NoError(t, err)
				gained[d.Files[0].Name] = g
			}
		}
		for name := range at {
			if _, ok := gained[name]; !ok {
				return false
			}
		}
		return true
	})
	ctx := context.Background()
	var ids []spate.SplitID
	for name, g := range gained {
		if wm, ok := at[name]; ok {
			require.NoError(t, coord.CommitAt(ctx, g.Split.ID, g.Epoch, spate.NewSplitProgress(wm, nil)))
		}
		ids = append(ids, g.Split.ID)
	}
	require.NoError(t, coord.Release(ctx, ids...))
}

// An input file truncated below its split's committed position, or
// deleted, before another worker takes the split over: that split alone
// fails, through the coordinator, with a reason naming the file and its
// sizes, and is quarantined at the attempt cap; the worker keeps running
// and completes every other split.
func TestChangedInputFailsOnlyItsSplitAtResume(t *testing.T) {
	in := t.TempDir()
	lines := corpus(t, in, map[string]string{
		"a.log": numbered("a", 40), "b.log": numbered("b", 40), "c.log": numbered("c", 40), "d.log": numbered("d", 40),
	})
	popts := filesource.PlannerOptions{MaxFiles: 1}
	store := mem.MustNew(mem.Options{TTL: e2eLease})
	defer store.Close()
	// Each split committed up to the end of its file's 20th line.
	lineEnd := int64(len(numbered("a", 20)))
	plan, err := filesource.NewPlanner(filesource.Dir(in), popts).Plan(context.Background(), spate.PlanContext{})
	require.NoError(t, err)
	fileOf := map[spate.SplitID]string{}
	for _, s := range plan.Splits {
		d, err := filesource.DecodeDescriptor(s.Spec.Descriptor)
		require.NoError(t, err)
		fileOf[s.Spec.ID] = d.Files[0].Name
	}
	seedProgress(t, store, in, popts, map[string]int64{"a.log": lineEnd, "b.log": lineEnd})
	require.NoError(t, os.Truncate(filepath.Join(in, "a.log"), lineEnd-10))
	require.NoError(t, os.Remove(filepath.Join(in, "b.log")))

	w := startWorkerWith(t, "taker", store, in, popts, 64, nil)
	r := w.wait(t)
	// The job cannot complete: two splits are quarantined. The worker
	// ended because the job stalled, not at the first resume check.
	require.Equal(t, pipeline.Failed, r.State, "report %+v", r)
	require.ErrorContains(t, r.Failure, "stalled", "report %+v", r)

	snap, err := spate.InspectJob(context.Background(), store, "")
	require.NoError(t, err)
	reasons := map[string]string{}
	for _, s := range snap.Splits {
		name := fileOf[s.ID]
		switch name {
		case "a.log", "b.log":
			require.Equal(t, spate.StatusQuarantined, s.Status, "split of %s", name)
			reasons[name] = s.LastFailure
		default:
			require.Equal(t, spate.StatusCompleted, s.Status, "split of %s", name)
		}
	}
	total := len(numbered("a", 40))
	require.Contains(t, reasons["a.log"], "a.log is "+itoa(int(lineEnd-10))+" bytes now, "+itoa(total)+" when planned, and the split's commits reach offset "+itoa(int(lineEnd)))
	require.Contains(t, reasons["b.log"], "b.log was deleted under the job: the split's commits reach offset "+itoa(int(lineEnd))+" of its "+itoa(total)+" planned bytes")

	seen := outputLines(t, w.out, 2)
	for key := range lines {
		switch {
		case strings.HasPrefix(key, "c.log:"), strings.HasPrefix(key, "d.log:"):
			require.Equal(t, 1, seen[key], "line %s", key)
		default:
			require.Zero(t, seen[key], "line %s of a changed file was delivered", key)
		}
	}
}
