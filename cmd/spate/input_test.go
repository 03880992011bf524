package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/pipeline/filesource"
)

// symlinkCorpus lays out dir/real (the files) and dir/src, whose inputs are
// a regular file and links to files of real (one in a subdirectory).
func symlinkCorpus(t *testing.T, dir string) (src string, lines int) {
	t.Helper()
	targets, src := filepath.Join(dir, "real"), filepath.Join(dir, "src")
	require.NoError(t, os.MkdirAll(filepath.Join(src, "sub"), 0o755))
	lines = writeCorpus(t, targets, 2, 50)
	lines += writeCorpus(t, src, 1, 30) // src/part-0/f00.txt, a regular file
	require.NoError(t, os.Symlink(filepath.Join(targets, "part-0", "f00.txt"), filepath.Join(src, "linked-a.txt")))
	require.NoError(t, os.Symlink(filepath.Join("..", "..", "real", "part-1", "f01.txt"), filepath.Join(src, "sub", "linked-b.txt")))
	return src, lines
}

// Links to regular files are listed under their own names, with their
// targets' sizes; the root may be a link itself.
func TestDirInputFollowsLinksToFiles(t *testing.T) {
	dir := t.TempDir()
	src, _ := symlinkCorpus(t, dir)
	root := filepath.Join(dir, "root-link")
	require.NoError(t, os.Symlink(src, root))
	for _, r := range []string{src, root} {
		in, err := openInput(context.Background(), r)
		require.NoError(t, err)
		ms, err := in.objs.List(context.Background())
		require.NoError(t, err)
		var names []string
		for _, m := range ms {
			names = append(names, m.Name)
			assert.Positive(t, m.Size, m.Name)
		}
		assert.Equal(t, []string{"linked-a.txt", "part-0/f00.txt", "sub/linked-b.txt"}, names, r)
		want, err := filesource.Dir(src).List(context.Background())
		require.NoError(t, err)
		assert.Equal(t, want[0].Size, ms[1].Size, "a regular file is listed as filesource.Dir lists it")
	}
}

// A file renamed or deleted between the directory's read and the look at
// its entry (logrotate shifting app.log.1 to app.log.2, deleting the
// oldest, removing a link) is left out of that listing, at debug level:
// the listing succeeds, and the next one finds the file under its new
// name. (It failed the whole listing with "lstat …: no such file or
// directory", a WARN and a lost replan, in the logrotate trial.)
func TestDirInputListingRacingARotation(t *testing.T) {
	src := t.TempDir()
	for _, name := range []string{"app1.log", "app1.log.1", "app2.log.3"} {
		require.NoError(t, os.WriteFile(filepath.Join(src, name), []byte("a line\n"), 0o644))
	}
	require.NoError(t, os.Symlink("app1.log", filepath.Join(src, "current.log")))
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	in := dirInput{Objects: filesource.Dir(src), root: src, skips: &filesource.SkipLog{Logger: log}}
	in.entered = func(path string) {
		switch filepath.Base(path) {
		case "app1.log.1":
			require.NoError(t, os.Rename(path, filepath.Join(src, "app1.log.2")))
		case "app2.log.3":
			require.NoError(t, os.Remove(path))
		case "current.log":
			require.NoError(t, os.Remove(path))
		}
	}
	names := func() []string {
		ms, err := in.List(context.Background())
		require.NoError(t, err, "a file that went away during the listing fails it")
		var out []string
		for _, m := range ms {
			out = append(out, m.Name)
		}
		return out
	}
	assert.Equal(t, []string{"app1.log"}, names(), "the files gone since the directory was read are left out")
	assert.NotContains(t, logs.String(), "level=WARN")
	assert.Contains(t, logs.String(), "level=DEBUG")
	for _, name := range []string{"app1.log.1", "app2.log.3", "current.log"} {
		assert.Contains(t, logs.String(), "file="+name)
	}
	in.entered = nil
	assert.Equal(t, []string{"app1.log", "app1.log.2"}, names(), "the next listing finds the renamed file")
}

// A link to a directory and a dangling link are refused, naming the link.
func TestDirInputRefusesDirectoryAndDanglingLinks(t *testing.T) {
	dir := t.TempDir()
	src, _ := symlinkCorpus(t, dir)
	link := filepath.Join(src, "dir-link")
	require.NoError(t, os.Symlink(filepath.Join(dir, "real"), link))
	_, err := openInput(context.Background(), src)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "dir-link is a symbolic link to the directory")
	assert.NotContains(t, err.Error(), "spate: fatal")

	require.NoError(t, os.Remove(link))
	require.NoError(t, os.Symlink("nowhere.txt", filepath.Join(src, "sub", "dangling")))
	_, err = openInput(context.Background(), src)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "sub/dangling is a symbolic link to nowhere.txt, which cannot be read")
}

// End to end: a backfill over linked inputs copies and verifies every line
// (it used to copy none of them and report "all 0 input lines"); a link
// to a directory stops it with exit 2 before --dst exists.
func TestBackfillFollowsSymlinkedInputs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src, lines := symlinkCorpus(t, dir)
	root := filepath.Join(dir, "root-link")
	require.NoError(t, os.Symlink(src, root))
	dst := filepath.Join(dir, "dst")
	code, out, errOut := runSpate(t, dir, "", 60*time.Second, "backfill", "--src", root, "--dst", dst,
		"--store", "mem://", "--lease", "1s", "--quiet")
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.Contains(t, out, "verified exactly once: all "+count(int64(lines))+" input lines (3 files")
	outs, err := filepath.Glob(filepath.Join(dst, "*.out"))
	require.NoError(t, err)
	require.NotEmpty(t, outs)
	body, err := os.ReadFile(outs[0])
	require.NoError(t, err)
	assert.Contains(t, string(body), "sub/linked-b.txt:0\t")

	require.NoError(t, os.Symlink(filepath.Join(dir, "real"), filepath.Join(src, "dir-link")))
	dst2 := filepath.Join(dir, "dst2")
	code, out, errOut = runSpate(t, dir, "", 60*time.Second, "backfill", "--src", src, "--dst", dst2, "--store", "mem://")
	assert.Equal(t, exitUsage, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.Equal(t, 1, strings.Count(errOut, "\n"), errOut)
	assert.Contains(t, errOut, "dir-link is a symbolic link to the directory")
	assert.NoDirExists(t, dst2)
}

// The help says what happens to links.
func TestBackfillHelpDocumentsLinks(t *testing.T) {
	t.Parallel()
	code, out, _ := runSpate(t, t.TempDir(), "", 30*time.Second, "backfill", "-h")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "Symbolic links to regular\nfiles are followed")
}
