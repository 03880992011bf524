package filesink

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/internal/filehook"
)

var stageSplit = spate.MustSplitID("s1")

// newSink opens a staged file sink of job "job" on dst, closed when the
// test ends; whole publishes whole files (PublishWhole).
func newSink(t *testing.T, dst string, whole bool) *StagedFileSink {
	t.Helper()
	s, err := NewStagedFileSink(dst, "job")
	require.NoError(t, err)
	s.PublishWhole = whole
	t.Cleanup(func() { s.Close() })
	return s
}

func stageRecords(p pipeline.PartitionID, from, to int64) []pipeline.Record {
	var rs []pipeline.Record
	for i := from; i < to; i++ {
		rs = append(rs, pipeline.Record{Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "line %d", i), Partition: p, Offset: i})
	}
	return rs
}

// publishedKeys counts the lines of split's published file by key.
func publishedKeys(t *testing.T, s *StagedFileSink, split spate.SplitID) map[string]int {
	t.Helper()
	seen := map[string]int{}
	f, err := os.Open(s.Path(split))
	if errors.Is(err, os.ErrNotExist) {
		return seen
	}
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, _, ok := strings.Cut(sc.Text(), "\t")
		require.True(t, ok, "torn line %q", sc.Text())
		seen[key]++
	}
	return seen
}

// requireExactly checks the published file holds k0..k(n-1) once each.
func requireExactly(t *testing.T, s *StagedFileSink, split spate.SplitID, n int) {
	t.Helper()
	seen := publishedKeys(t, s, split)
	for i := range n {
		require.Equal(t, 1, seen[fmt.Sprintf("k%d", i)], "line k%d", i)
	}
	require.Len(t, seen, n)
}

func openStage(t *testing.T, s *StagedFileSink, epoch uint64, p pipeline.PartitionID, committed []byte) {
	t.Helper()
	require.NoError(t, s.OpenStage(context.Background(), pipeline.StageTenancy{Split: stageSplit, Epoch: spate.LeaseEpoch(epoch), Partition: p}, committed))
}

func write(t *testing.T, s *StagedFileSink, p pipeline.PartitionID, from, to int64) {
	t.Helper()
	require.NoError(t, s.Write(context.Background(), 0, stageRecords(p, from, to)))
}

func prepare(t *testing.T, s *StagedFileSink, p pipeline.PartitionID, w int64) []byte {
	t.Helper()
	c, _, _, err := s.Prepare(context.Background(), p, w, false)
	require.NoError(t, err)
	return c
}

func TestStagedFileSinkPublishesOnlyWhatACommitLists(t *testing.T) {
	s := newSink(t, t.TempDir(), false)
	openStage(t, s, 1, 0, nil)
	write(t, s, 0, 0, 10)
	requireExactly(t, s, stageSplit, 0) // staged, nothing visible

	c, _, pending, err := s.Prepare(context.Background(), 0, 5, false)
	require.NoError(t, err)
	require.True(t, pending)
	requireExactly(t, s, stageSplit, 0) // prepared, the commit has not won
	require.NoError(t, s.Publish(context.Background(), 0, c))
	requireExactly(t, s, stageSplit, 5)
	require.NoError(t, s.Publish(context.Background(), 0, c), "a second publish is a no-op")
	requireExactly(t, s, stageSplit, 5)

	c, _, pending, err = s.Prepare(context.Background(), 0, 5, false)
	require.NoError(t, err)
	require.False(t, pending, "nothing new below the watermark")
	require.NoError(t, s.Publish(context.Background(), 0, c))
	write(t, s, 0, 10, 12)
	require.NoError(t, s.Publish(context.Background(), 0, prepare(t, s, 0, 12)))
	requireExactly(t, s, stageSplit, 12)
	s.CloseStage(0, true)
	assert.NoDirExists(t, filepath.Join(s.Destination(), ".spate", "stage", stageSplit.String()), "a completed split's staging goes")
}

// A crashed owner's commit that won but was never published is finished
// by the next owner, which then discards the old staging file; the old
// owner waking up as a zombie can publish again (the same bytes at the
// same place) but nothing it stages later is ever listed.
func TestStagedFileSinkTakeoverFinishesThePublishAndFencesTheZombie(t *testing.T) {
	dst := t.TempDir()
	a := newSink(t, dst, false)
	openStage(t, a, 1, 0, nil)
	write(t, a, 0, 0, 4)
	require.NoError(t, a.Publish(context.Background(), 0, prepare(t, a, 0, 4)))
	write(t, a, 0, 4, 8)
	won := prepare(t, a, 0, 8) // the commit carrying it wins; A freezes before publishing
	write(t, a, 0, 8, 12)      // staged past the commit: never listed

	b := newSink(t, dst, false)
	openStage(t, b, 2, 7, won)
	requireExactly(t, b, stageSplit, 8)
	stage1 := filepath.Join(dst, ".spate", "stage", stageSplit.String(), "1.stage")
	assert.NoFileExists(t, stage1, "the old owner's staging file is discarded")

	// The zombie wakes: its publish of the won commit is idempotent; it
	// stages on (into a deleted file) and its next commit is fenced.
	require.NoError(t, a.Publish(context.Background(), 0, won))
	write(t, a, 0, 12, 20)
	_ = prepare(t, a, 0, 20)
	requireExactly(t, b, stageSplit, 8)

	write(t, b, 7, 8, 16)
	require.NoError(t, b.Publish(context.Background(), 7, prepare(t, b, 7, 16)))
	requireExactly(t, b, stageSplit, 16)
}

// A run interrupted at any point of a commit resumes to exactly-once
// output: before the commit (its committable is lost with it), after it
// but before the publish, halfway through the publish, after it.
func TestStagedFileSinkResumesFromAnyInterruption(t *testing.T) {
	for _, point := range []string{"before-commit", "before-publish", "mid-publish", "after-publish"} {
		t.Run(point, func(t *testing.T) {
			dst := t.TempDir()
			a := newSink(t, dst, false)
			openStage(t, a, 1, 0, nil)
			write(t, a, 0, 0, 5)
			committed := prepare(t, a, 0, 5)
			require.NoError(t, a.Publish(context.Background(), 0, committed))
			write(t, a, 0, 5, 10)
			next := prepare(t, a, 0, 10)
			want := 10
			switch point {
			case "before-commit":
				want = 5 // the commit did not land: 5..9 replay under the next owner
			case "before-publish":
				committed = next
			case "mid-publish":
				committed = next
				c, err := decodeStagedCommit(next)
				require.NoError(t, err)
				data, err := readRange(filepath.Join(dst, c.Stage), c.From, c.To)
				require.NoError(t, err)
				f, err := os.OpenFile(a.Path(stageSplit), os.O_WRONLY, 0)
				require.NoError(t, err)
				_, err = f.WriteAt(data[:len(data)/2], c.Len)
				require.NoError(t, err)
				require.NoError(t, f.Close())
			case "after-publish":
				committed = next
				require.NoError(t, a.Publish(context.Background(), 0, next))
			}
			a.Close()

			b := newSink(t, dst, false)
			openStage(t, b, 2, 1, committed)
			requireExactly(t, b, stageSplit, want)
			write(t, b, 1, int64(want), 12)
			require.NoError(t, b.Publish(context.Background(), 1, prepare(t, b, 1, 12)))
			requireExactly(t, b, stageSplit, 12)
		})
	}
}

// Damage to the published or staged files, or to the destination, gets
// an error naming the file and the fix, and changes no published byte.
func TestStagedFileSinkDamage(t *testing.T) {
	// setup leaves a destination with 4 lines published and a won,
	// unpublished commit listing 4 more.
	setup := func(t *testing.T) (dst string, committed []byte) {
		dst = t.TempDir()
		a, err := NewStagedFileSink(dst, "job")
		require.NoError(t, err)
		openStage(t, a, 1, 0, nil)
		write(t, a, 0, 0, 4)
		require.NoError(t, a.Publish(context.Background(), 0, prepare(t, a, 0, 4)))
		write(t, a, 0, 4, 8)
		committed = prepare(t, a, 0, 8)
		a.Close()
		return dst, committed
	}
	published := func(dst string) string { return filepath.Join(dst, stageSplit.String()+".out") }
	staged := func(dst string) string { return filepath.Join(dst, ".spate", "stage", stageSplit.String(), "1.stage") }
	cases := []struct {
		name   string
		damage func(t *testing.T, dst string)
		want   []string
	}{
		{"published file deleted", func(t *testing.T, dst string) { require.NoError(t, os.Remove(published(dst))) },
			[]string{"truncated or deleted", "delete the job and its output"}},
		{"published file truncated", func(t *testing.T, dst string) { require.NoError(t, os.Truncate(published(dst), 3)) },
			[]string{"truncated or deleted"}},
		{"published file altered", func(t *testing.T, dst string) {
			b, err := os.ReadFile(published(dst))
			require.NoError(t, err)
			b[0] ^= 1
			require.NoError(t, os.WriteFile(published(dst), b, 0o644))
		}, []string{"was altered", "committed checksum"}},
		{"published file with bytes no commit lists", func(t *testing.T, dst string) {
			f, err := os.OpenFile(published(dst), os.O_APPEND|os.O_WRONLY, 0)
			require.NoError(t, err)
			_, err = f.WriteString(strings.Repeat("alien line\n", 50))
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}, []string{"past the", "committed"}},
		{"staged file deleted before its publish", func(t *testing.T, dst string) { require.NoError(t, os.Remove(staged(dst))) },
			[]string{staged(""), "damaged", "cannot be completed"}},
		{"staged file altered before its publish", func(t *testing.T, dst string) {
			b, err := os.ReadFile(staged(dst))
			require.NoError(t, err)
			b[len(b)-2] ^= 1
			require.NoError(t, os.WriteFile(staged(dst), b, 0o644))
		}, []string{"no longer match the committed checksum"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dst, committed := setup(t)
			tc.damage(t, dst)
			before, _ := os.ReadFile(published(dst))
			b := newSink(t, dst, false)
			err := b.OpenStage(context.Background(), pipeline.StageTenancy{Split: stageSplit, Epoch: 2, Partition: 1}, committed)
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), strings.TrimPrefix(w, "/"))
			}
			assert.Contains(t, err.Error(), dst, "the error names the file")
			after, _ := os.ReadFile(published(dst))
			assert.Equal(t, before, after, "a damaged split's published bytes are left as they were")
		})
	}

	t.Run("published name present without a commit", func(t *testing.T) {
		dst := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dst, stageSplit.String()+".out"), []byte("someone else's\n"), 0o644))
		s, err := NewStagedFileSink(dst, "job")
		require.NoError(t, err)
		err = s.OpenStage(context.Background(), pipeline.StageTenancy{Split: stageSplit, Epoch: 1}, nil)
		require.ErrorContains(t, err, "already holds 15 bytes")
		require.ErrorContains(t, err, "empty destination")
	})
	t.Run("two jobs on one destination", func(t *testing.T) {
		dst := t.TempDir()
		_, err := NewStagedFileSink(dst, "one")
		require.NoError(t, err)
		_, err = NewStagedFileSink(dst, "two")
		require.ErrorContains(t, err, `holds the output of job "one"`)
		require.ErrorContains(t, err, "its own destination")
		_, err = NewStagedFileSink(dst, "one")
		require.NoError(t, err, "the same job reopens its destination")
	})
	t.Run("destination not writable", func(t *testing.T) {
		// Even root cannot create a directory under /proc.
		_, err := NewStagedFileSink("/proc/spate-no-such-dst", "job")
		require.ErrorContains(t, err, "cannot create the destination /proc/spate-no-such-dst")
	})
	t.Run("published file deleted under a running tenancy", func(t *testing.T) {
		dst := t.TempDir()
		s := newSink(t, dst, false)
		openStage(t, s, 1, 0, nil)
		write(t, s, 0, 0, 4)
		require.NoError(t, s.Publish(context.Background(), 0, prepare(t, s, 0, 4)))
		require.NoError(t, os.Remove(s.Path(stageSplit)))
		write(t, s, 0, 4, 8)
		err := s.Publish(context.Background(), 0, prepare(t, s, 0, 8))
		require.ErrorContains(t, err, "is gone")
		require.ErrorContains(t, err, s.Path(stageSplit))
	})
	t.Run("alien committable", func(t *testing.T) {
		s, err := NewStagedFileSink(t.TempDir(), "job")
		require.NoError(t, err)
		for _, c := range []string{`{"offset":12}`, `not json`, `{"v":1,"file":"../../etc/passwd","len":0,"crc":0}`, `{"v":2,"file":"s1.out"}`} {
			err = s.OpenStage(context.Background(), pipeline.StageTenancy{Split: stageSplit, Epoch: 1}, []byte(c))
			require.ErrorContains(t, err, "not this sink's", c)
		}
	})
}

func TestStagedFileSinkRefusesUnwiredAndDisorderedRecords(t *testing.T) {
	s, err := NewStagedFileSink(t.TempDir(), "")
	require.NoError(t, err)
	defer s.Close()
	err = s.Write(context.Background(), 0, stageRecords(3, 0, 2))
	require.ErrorIs(t, err, pipeline.ErrNoStage)
	require.ErrorIs(t, err, spate.ErrFatal)

	openStage(t, s, 1, 0, nil)
	write(t, s, 0, 5, 8)
	err = s.Write(context.Background(), 0, stageRecords(0, 2, 3))
	require.ErrorIs(t, err, spate.ErrFatal)
	require.ErrorContains(t, err, "offset order")

	s.CloseStage(0, false)
	require.NoError(t, s.Write(context.Background(), 0, stageRecords(0, 8, 9)), "records of an ended tenancy are dropped")
}

// Workers of one job started at the same moment all open the destination:
// none may see the job marker half written and take it for another job's;
// a worker of another job is still refused.
func TestStagedFileSinkClaimsTheDestinationAtomically(t *testing.T) {
	for round := range 20 {
		dir := filepath.Join(t.TempDir(), fmt.Sprint(round))
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Go(func() { _, errs[i] = NewStagedFileSink(dir, "job-a") })
		}
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "round %d, worker %d", round, i)
		}
		_, err := NewStagedFileSink(dir, "job-b")
		require.ErrorContains(t, err, `holds the output of job "job-a"`)
		left, err := filepath.Glob(filepath.Join(dir, ".spate", "job.tmp-*"))
		require.NoError(t, err)
		require.Empty(t, left, "temporary markers left behind")
	}
}

// Every directory on the path of a committed file is durable before a
// commit can name the file: each one the sink creates is fsynced into its
// parent, and the staging file into its directory. (Not parallel: it
// watches the package's syncDir.)
func TestStagedFileSinkMakesTheDirectoriesItCreatesDurable(t *testing.T) {
	var mu sync.Mutex
	var synced []string
	real := syncDir
	syncDir = func(dir string) error {
		mu.Lock()
		synced = append(synced, dir)
		mu.Unlock()
		return real(dir)
	}
	defer func() { syncDir = real }()

	root := t.TempDir()
	dst := filepath.Join(root, "out", "job")
	s, err := NewStagedFileSink(dst, "")
	require.NoError(t, err)
	defer s.Close()
	meta := filepath.Join(dst, ".spate")
	stageRoot := filepath.Join(meta, "stage")
	assert.Equal(t, []string{root, filepath.Join(root, "out"), dst, meta}, synced,
		"each new directory of the destination, fsynced into its parent, top down")

	synced = nil
	openStage(t, s, 1, 0, nil)
	splitDir := filepath.Join(stageRoot, stageSplit.String())
	assert.Equal(t, []string{stageRoot, splitDir}, synced,
		"the split's staging directory into the staging root, then the staging file into it")

	synced = nil
	s.CloseStage(0, false)
	openStage(t, s, 2, 0, nil)
	assert.Equal(t, []string{splitDir}, synced, "an existing directory is not synced again")

	// A path through a file is refused with the file named.
	file := filepath.Join(root, "plain")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	_, err = NewStagedFileSink(filepath.Join(file, "dst"), "")
	require.ErrorContains(t, err, file)
}

// A disk that fills up halfway through a publish left a torn last line in
// the published file until the next run. The part written is undone: the
// file never shows more than whole committed lines, and the retry
// publishes the range whole.
func TestStagedFileSinkUndoesAPublishTornByAFullDisk(t *testing.T) {
	s := newSink(t, t.TempDir(), false)
	openStage(t, s, 1, 0, nil)
	write(t, s, 0, 0, 10)
	require.NoError(t, s.Publish(context.Background(), 0, prepare(t, s, 0, 5)))
	requireExactly(t, s, stageSplit, 5)
	before, err := os.ReadFile(s.Path(stageSplit))
	require.NoError(t, err)

	c := prepare(t, s, 0, 10)
	real := filehook.PublishWrite
	defer func() { filehook.PublishWrite = real }()
	filehook.PublishWrite = func(out *os.File, off, n int64, _ func() error) error {
		if _, err := out.WriteAt(bytes.Repeat([]byte("x"), int(n/2)), off); err != nil {
			return err
		}
		return &os.PathError{Op: "write", Path: out.Name(), Err: syscall.ENOSPC}
	}
	err = s.Publish(context.Background(), 0, c)
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.Contains(t, err.Error(), s.Path(stageSplit))
	after, err := os.ReadFile(s.Path(stageSplit))
	require.NoError(t, err)
	require.Equal(t, string(before), string(after), "a torn publish is visible under the final name")

	filehook.PublishWrite = real
	require.NoError(t, s.Publish(context.Background(), 0, c), "the retry")
	requireExactly(t, s, stageSplit, 10)
}

// A store rolled back to an older state lists less than a published file
// holds. The error says the store may have lost commits, and never
// advises deleting the file (it holds committed output).
func TestStagedFileSinkBlamesARolledBackStoreSafely(t *testing.T) {
	dir := t.TempDir()
	s := newSink(t, dir, false)
	openStage(t, s, 1, 0, nil)
	write(t, s, 0, 0, 10)
	older := prepare(t, s, 0, 5)
	require.NoError(t, s.Publish(context.Background(), 0, older))
	require.NoError(t, s.Publish(context.Background(), 0, prepare(t, s, 0, 10)))
	requireExactly(t, s, stageSplit, 10)
	s.CloseStage(0, false)

	// The store went back to the record of the first commit.
	err := s.OpenStage(context.Background(), pipeline.StageTenancy{Split: stageSplit, Epoch: 2, Partition: 1}, older)
	require.Error(t, err)
	for _, want := range []string{s.Path(stageSplit), "the store lost commits", "restored from a backup or rolled back", "do not delete it"} {
		assert.Contains(t, err.Error(), want)
	}
	assert.NotContains(t, err.Error(), "move it away")
	requireExactly(t, s, stageSplit, 10)
}
