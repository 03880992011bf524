package filesink

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/internal/filehook"
)

func prepareFinal(t *testing.T, s *StagedFileSink, p pipeline.PartitionID, w int64) ([]byte, bool) {
	t.Helper()
	c, covered, pending, err := s.Prepare(context.Background(), p, w, true)
	require.NoError(t, err)
	require.Equal(t, w, covered)
	return c, pending
}

func stagePathOf(dst string, epoch int) string {
	return filepath.Join(dst, ".spate", "stage", stageSplit.String(), fmt.Sprintf("%d.stage", epoch))
}

// Whole-file publishing writes each byte once: the published file is the
// tenancy's staging file itself (the same inode, renamed), holding
// exactly the committed lines, and nothing is copied. Intermediate
// commits make the staged bytes durable but publish nothing. (With
// PublishWhole off, the default, the same steps copy every range into
// another file: the inode differs and this test fails.)
func TestStagedFileSinkPublishWholeWritesEachByteOnce(t *testing.T) {
	dst := t.TempDir()
	s := newSink(t, dst, true)
	openStage(t, s, 1, 0, nil)
	var publishes int
	old := filehook.PublishWrite
	filehook.PublishWrite = func(out *os.File, off, n int64, write func() error) error { publishes++; return write() }
	t.Cleanup(func() { filehook.PublishWrite = old })

	write(t, s, 0, 0, 10)
	c, _, pending, err := s.Prepare(context.Background(), 0, 5, false)
	require.NoError(t, err)
	require.NoError(t, s.Publish(context.Background(), 0, c))
	require.False(t, pending, "an intermediate commit publishes nothing")
	write(t, s, 0, 10, 20)
	require.NoError(t, s.Publish(context.Background(), 0, prepare(t, s, 0, 15)))
	requireExactly(t, s, stageSplit, 0) // nothing visible before the split completes under whole publishing

	staged, err := os.Stat(stagePathOf(dst, 1))
	require.NoError(t, err)
	c, pending = prepareFinal(t, s, 0, 20)
	require.True(t, pending, "the final committable lists a publish")
	requireExactly(t, s, stageSplit, 0) // the commit has not won yet
	require.NoError(t, s.Publish(context.Background(), 0, c))
	requireExactly(t, s, stageSplit, 20)
	published, err := os.Stat(s.Path(stageSplit))
	require.NoError(t, err)
	assert.True(t, os.SameFile(staged, published), "the published file is not the staged one: its bytes were written twice")
	assert.Zero(t, publishes, "bytes were copied into the published file")
	assert.NoFileExists(t, stagePathOf(dst, 1))

	require.NoError(t, s.Publish(context.Background(), 0, c), "a second publish is a no-op")
	c, pending = prepareFinal(t, s, 0, 20)
	require.False(t, pending, "published: the completion needs no more publishing")
	require.NoError(t, s.Publish(context.Background(), 0, c))
	requireExactly(t, s, stageSplit, 20)
	s.CloseStage(0, true)
	assert.NoDirExists(t, filepath.Join(dst, ".spate", "stage", stageSplit.String()))
}

// An owner that dies before its first commit leaves the next owner the
// same source: the staging file the committed record lists is not
// deleted by a tenancy that never listed its own (it was, and the third
// owner found the split's committed output gone).
func TestStagedFileSinkPublishWholeSurvivesTwoTakeoversWithoutACommit(t *testing.T) {
	dst := t.TempDir()
	a := newSink(t, dst, true)
	openStage(t, a, 1, 0, nil)
	write(t, a, 0, 0, 6)
	won := prepare(t, a, 0, 6) // wins; A dies
	b := newSink(t, dst, true)
	openStage(t, b, 2, 1, won)
	write(t, b, 1, 6, 8) // B dies before any commit
	c := newSink(t, dst, true)
	openStage(t, c, 3, 2, won)
	write(t, c, 2, 6, 10)
	final, _ := prepareFinal(t, c, 2, 10)
	require.NoError(t, c.Publish(context.Background(), 2, final))
	requireExactly(t, c, stageSplit, 10)
}

// Whole publishing of a zombie: an owner frozen after a commit keeps
// staging; the new owner copies the committed prefix from the listed
// staging file into its own, deletes the old one, and publishes exactly
// once; the zombie's later stage and commits reach nothing published.
func TestStagedFileSinkPublishWholeTakeoverFencesTheZombie(t *testing.T) {
	dst := t.TempDir()
	a := newSink(t, dst, true)
	openStage(t, a, 1, 0, nil)
	write(t, a, 0, 0, 8)
	won := prepare(t, a, 0, 5) // wins; A freezes
	write(t, a, 0, 8, 12)

	b := newSink(t, dst, true)
	openStage(t, b, 2, 3, won)
	assert.FileExists(t, stagePathOf(dst, 1), "the listed staging file stays until b's own is listed")
	requireExactly(t, b, stageSplit, 0)
	require.NoError(t, b.Publish(context.Background(), 3, prepare(t, b, 3, 5)))
	assert.NoFileExists(t, stagePathOf(dst, 1), "the old owner's staging file is discarded once b's commit lists its own")

	// The zombie wakes: it stages into its deleted file; its final
	// commit is fenced, so nobody publishes it (publishing what it did
	// not win is refused anyway: it lists nothing of b's).
	write(t, a, 0, 12, 30)
	prepareFinal(t, a, 0, 30)

	write(t, b, 3, 5, 20) // a hand-back at 16: 16..19 are cut from the file
	c, pending := prepareFinal(t, b, 3, 16)
	require.True(t, pending)
	require.NoError(t, b.Publish(context.Background(), 3, c))
	requireExactly(t, b, stageSplit, 16)
	assert.NoFileExists(t, stagePathOf(dst, 1))
}

// A whole publish interrupted at any point resumes to exactly-once
// output under the next owner: before the final commit, after it but
// before the rename, after the rename; and after a hand-back published a
// part of the split, which the next owner's file replaces.
func TestStagedFileSinkPublishWholeResumesFromAnyInterruption(t *testing.T) {
	for _, point := range []string{"before-commit", "before-publish", "after-publish", "zombie-publishes-late"} {
		t.Run(point, func(t *testing.T) {
			dst := t.TempDir()
			a := newSink(t, dst, true)
			openStage(t, a, 1, 0, nil)
			write(t, a, 0, 0, 10)
			committed := prepare(t, a, 0, 5)
			final, pending := prepareFinal(t, a, 0, 10) // a hand-back
			require.True(t, pending)
			want := 10
			switch point {
			case "before-commit":
				want = 5 // the final commit did not land: 5..9 replay
			case "before-publish", "zombie-publishes-late":
				committed = final
			case "after-publish":
				committed = final
				require.NoError(t, a.Publish(context.Background(), 0, final))
			}

			b := newSink(t, dst, true)
			openStage(t, b, 2, 1, committed)
			if point != "before-commit" {
				requireExactly(t, b, stageSplit, 10) // the next owner finished the rename
			}
			if point == "zombie-publishes-late" {
				require.NoError(t, a.Publish(context.Background(), 0, final), "the zombie's publish is idempotent")
			}
			write(t, b, 1, int64(want), 14)
			c, _ := prepareFinal(t, b, 1, 14)
			require.NoError(t, b.Publish(context.Background(), 1, c))
			requireExactly(t, b, stageSplit, 14)
			if point == "zombie-publishes-late" {
				// Woken again after b published: the rename it lists is
				// done, the file is b's, longer: nothing of the zombie's
				// lands, whatever the call returns.
				_ = a.Publish(context.Background(), 0, final)
				requireExactly(t, b, stageSplit, 14)
			}
		})
	}
}

// Damage under whole publishing is found and named: a listed staging file
// deleted before its rename, a published file altered after a hand-back,
// a published name present with no committed output.
func TestStagedFileSinkPublishWholeDamage(t *testing.T) {
	t.Run("staging file deleted before the rename", func(t *testing.T) {
		dst := t.TempDir()
		s := newSink(t, dst, true)
		openStage(t, s, 1, 0, nil)
		write(t, s, 0, 0, 6)
		c, _ := prepareFinal(t, s, 0, 6)
		require.NoError(t, os.Remove(stagePathOf(dst, 1)))
		err := s.Publish(context.Background(), 0, c)
		require.ErrorContains(t, err, stagePathOf(dst, 1))
		require.ErrorContains(t, err, "is gone")
		requireExactly(t, s, stageSplit, 0)

		b := newSink(t, dst, true)
		err = b.OpenStage(context.Background(), pipeline.StageTenancy{Split: stageSplit, Epoch: 2, Partition: 1}, c)
		require.ErrorContains(t, err, "is gone")
	})
	t.Run("published file altered after a hand-back", func(t *testing.T) {
		dst := t.TempDir()
		s := newSink(t, dst, true)
		openStage(t, s, 1, 0, nil)
		write(t, s, 0, 0, 6)
		c, _ := prepareFinal(t, s, 0, 6)
		require.NoError(t, s.Publish(context.Background(), 0, c))
		s.CloseStage(0, false)
		f, err := os.OpenFile(s.Path(stageSplit), os.O_WRONLY, 0)
		require.NoError(t, err)
		_, err = f.WriteAt([]byte("X"), 1)
		require.NoError(t, err)
		require.NoError(t, f.Close())

		b := newSink(t, dst, true)
		err = b.OpenStage(context.Background(), pipeline.StageTenancy{Split: stageSplit, Epoch: 2, Partition: 1}, c)
		require.ErrorContains(t, err, "altered under the job")
		require.ErrorContains(t, err, s.Path(stageSplit))
	})
	t.Run("published name present with no committed output", func(t *testing.T) {
		dst := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dst, stageSplit.String()+".out"), []byte("someone else's\n"), 0o644))
		s := newSink(t, dst, true)
		err := s.OpenStage(context.Background(), pipeline.StageTenancy{Split: stageSplit, Epoch: 1}, nil)
		require.ErrorContains(t, err, "has no committed output")
	})
	t.Run("a default-mode sink refuses a whole-mode record", func(t *testing.T) {
		dst := t.TempDir()
		s := newSink(t, dst, true)
		openStage(t, s, 1, 0, nil)
		write(t, s, 0, 0, 3)
		c := prepare(t, s, 0, 3)
		d := newSink(t, dst, false)
		err := d.OpenStage(context.Background(), pipeline.StageTenancy{Split: stageSplit, Epoch: 2}, c)
		require.ErrorContains(t, err, "--publish=complete")
	})
	t.Run("a whole-mode sink finishes a default-mode record", func(t *testing.T) {
		dst := t.TempDir()
		d := newSink(t, dst, false)
		openStage(t, d, 1, 0, nil)
		write(t, d, 0, 0, 4)
		require.NoError(t, d.Publish(context.Background(), 0, prepare(t, d, 0, 4)))
		write(t, d, 0, 4, 7)
		won := prepare(t, d, 0, 7) // won, not published
		s := newSink(t, dst, true)
		openStage(t, s, 2, 1, won)
		requireExactly(t, s, stageSplit, 7)
		write(t, s, 1, 7, 9)
		c, _ := prepareFinal(t, s, 1, 9)
		require.NoError(t, s.Publish(context.Background(), 1, c))
		requireExactly(t, s, stageSplit, 9)
	})
	t.Run("a commit past the final one is refused", func(t *testing.T) {
		s := newSink(t, t.TempDir(), true)
		openStage(t, s, 1, 0, nil)
		write(t, s, 0, 0, 3)
		prepareFinal(t, s, 0, 3)
		write(t, s, 0, 3, 5) // dropped: sealed
		_, _, _, err := s.Prepare(context.Background(), 0, 5, true)
		require.ErrorContains(t, err, "sealed")
	})
}

// The file sink's stage openings mark passing file-system faults
// Retryable (the coordination driver tries again without spending an
// attempt); a full disk only a bounded number of times in a row, then as
// the error it is (the split is set aside with it as the reason); damage
// never.
func TestStagedFileSinkMarksTransientStageFaultsRetryable(t *testing.T) {
	s, err := NewStagedFileSink(t.TempDir(), "")
	require.NoError(t, err)
	defer s.Close()
	pathErr := func(errno syscall.Errno) error {
		return fmt.Errorf("cannot create the staging file x: %w", &os.PathError{Op: "open", Path: "x", Err: errno})
	}
	for _, errno := range []syscall.Errno{syscall.EINTR, syscall.EAGAIN, syscall.EMFILE, syscall.ESTALE} {
		err := s.classifyStageError(pathErr(errno))
		assert.True(t, pipeline.TransientStageError(err), "%v", errno)
		assert.Equal(t, pathErr(errno).Error(), err.Error(), "the message is unchanged")
		assert.ErrorIs(t, err, errno)
	}
	assert.False(t, pipeline.TransientStageError(s.classifyStageError(pathErr(syscall.EACCES))))
	assert.False(t, pipeline.TransientStageError(s.classifyStageError(fmt.Errorf("%w: x was altered", pipeline.ErrOutputDamaged))))
	for i := range noSpaceStageRetries {
		assert.True(t, pipeline.TransientStageError(s.classifyStageError(pathErr(syscall.ENOSPC))), "full disk %d", i+1)
	}
	err = s.classifyStageError(pathErr(syscall.ENOSPC))
	assert.False(t, pipeline.TransientStageError(err), "a disk full past the bounded retries")
	assert.ErrorIs(t, err, syscall.ENOSPC)
	require.NoError(t, s.classifyStageError(nil))
	assert.True(t, pipeline.TransientStageError(s.classifyStageError(pathErr(syscall.EDQUOT))), "a success starts the count again")

	// A real fault through OpenStage: the destination's staging directory
	// replaced by a file is no passing fault.
	dst := t.TempDir()
	w := newSink(t, dst, true)
	require.NoError(t, os.WriteFile(filepath.Join(dst, ".spate", "stage", stageSplit.String()), nil, 0o644))
	err = w.OpenStage(context.Background(), pipeline.StageTenancy{Split: stageSplit, Epoch: 1}, nil)
	require.Error(t, err)
	assert.False(t, spate.IsRetryable(err), "%v", err)
	assert.False(t, errors.Is(err, spate.ErrRetryable))
}

// A tenancy whose stage opens late (its process frozen between gaining
// the split and opening the stage, woken after a newer owner took the
// split over) is a zombie: its stage must not reach the newer owner's
// staging file, which that owner's commits list. Without the guard the
// late open deleted every other staging file of the split: under whole
// publishing the newer owner's final commit then listed a file that was
// gone, its rename failed, and the split was set aside (the kill/stop
// test of spate backfill --publish complete, about 2 runs in 3); under
// the default publishing the next owner after it found the listed range
// gone.
func TestStagedFileSinkALateZombieStageKeepsNewerStagingFiles(t *testing.T) {
	for _, whole := range []bool{true, false} {
		t.Run(fmt.Sprintf("whole=%t", whole), func(t *testing.T) {
			dst := t.TempDir()
			sink := func() *StagedFileSink { return newSink(t, dst, whole) }
			// B owns the split at epoch 2 (epoch 1, the zombie's, gained
			// it first and froze before opening its stage).
			b := sink()
			openStage(t, b, 2, 1, nil)
			write(t, b, 1, 0, 6)
			won := prepare(t, b, 1, 6) // wins; not yet published

			// The zombie wakes and opens its stage of epoch 1 with the
			// record it read when it gained the split (none).
			zombie := sink()
			openStage(t, zombie, 1, 0, nil)
			write(t, zombie, 0, 0, 3)
			require.FileExists(t, stagePathOf(dst, 2), "the zombie's stage deleted the staging file the newer owner's commit lists")

			if whole {
				require.NoError(t, b.Publish(context.Background(), 1, won))
				write(t, b, 1, 6, 10)
				final, pending := prepareFinal(t, b, 1, 10)
				require.True(t, pending)
				require.NoError(t, b.Publish(context.Background(), 1, final), "the newer owner's listed staging file must still be there to publish")
				requireExactly(t, b, stageSplit, 10)
				return
			}
			// Default publishing: B dies before publishing; C takes over
			// from B's record and publishes the range it lists from B's
			// staging file.
			c := sink()
			openStage(t, c, 3, 2, won)
			write(t, c, 2, 6, 10)
			require.NoError(t, c.Publish(context.Background(), 2, prepare(t, c, 2, 10)))
			requireExactly(t, c, stageSplit, 10)
		})
	}
}
