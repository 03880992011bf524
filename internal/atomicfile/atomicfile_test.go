package atomicfile

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWriteNewWritesOnceAndLeavesNoTemporary(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "marker")
	require.NoError(t, WriteNew(path, []byte("first\n")))
	err := WriteNew(path, []byte("second\n"))
	require.ErrorIs(t, err, fs.ErrExist, "a second write over an existing file must fail with fs.ErrExist")
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "first\n", string(got), "the existing file was changed")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "a temporary file was left beside the marker: %v", entries)
}

func TestWriteNewNeedsItsDirectory(t *testing.T) {
	err := WriteNew(filepath.Join(t.TempDir(), "missing", "marker"), []byte("x"))
	require.ErrorIs(t, err, fs.ErrNotExist)
}
