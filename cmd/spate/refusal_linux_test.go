package main

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A refusal (exit 2) is a plain sentence: a --src whose listing fails (a
// directory nested past the path length limit, so that it fails for root
// too) is refused naming the directory and the reason, without the
// error class ("retryable: ") the library marks it with for programs.
func TestRefusalIsAPlainSentence(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	deepDir(t, src, 24, 200) // 24 x 201 bytes: past PATH_MAX (4096)
	code, out, errOut := runSpate(t, dir, "", 60*time.Second, "backfill", "--src", src, "--dst", filepath.Join(dir, "dst"), "--store", "mem://")
	expectCode(t, "backfill over an unlistable --src", code, exitUsage, out, errOut)
	require.Contains(t, errOut, "file name too long", "the refusal does not give the reason:\n%s", errOut)
	assert.True(t, strings.HasPrefix(errOut, "spate backfill: --src "+src+": list "+src+": "), "the refusal does not name --src first:\n%s", errOut)
	for _, class := range []string{"retryable", "fatal", "fenced"} {
		assert.NotContains(t, errOut, class, "the refusal carries an error class:\n%s", errOut)
	}
	assert.Equal(t, 1, strings.Count(errOut, "\n"), "the refusal is not one line:\n%s", errOut)
}

// deepDir makes depth nested directories under root, each name n bytes
// long, creating each relative to its parent (the full path is too long
// for one system call).
func deepDir(t *testing.T, root string, depth, n int) {
	t.Helper()
	require.NoError(t, syscall.Mkdir(root, 0o755))
	fd, err := syscall.Open(root, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	require.NoError(t, err)
	name := strings.Repeat("d", n)
	for range depth {
		require.NoError(t, syscall.Mkdirat(fd, name, 0o755))
		next, err := syscall.Openat(fd, name, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
		syscall.Close(fd)
		require.NoError(t, err)
		fd = next
	}
	syscall.Close(fd)
}
