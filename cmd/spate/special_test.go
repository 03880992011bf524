//go:build linux

package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// A FIFO in --src, and a link to one, are skipped without being opened
// (an open would block), each named once in a warning however often the
// input is listed.
func TestDirInputSkipsSpecialFilesWithAWarning(t *testing.T) {
	src := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(src, "a.log"), []byte("x\n"), 0o644))
	require.NoError(t, syscall.Mkfifo(filepath.Join(src, "pipe"), 0o644))
	require.NoError(t, os.Symlink("pipe", filepath.Join(src, "pipe-link")))
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	defer slog.SetDefault(old)
	in, err := openInput(context.Background(), src) // lists once
	require.NoError(t, err)
	for range 2 {
		ms, err := in.objs.List(context.Background())
		require.NoError(t, err)
		require.Len(t, ms, 1)
		require.Equal(t, "a.log", ms[0].Name)
	}
	warned := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, warned, 2, "%v", warned)
	require.Contains(t, buf.String(), "file=pipe type=FIFO")
	require.Contains(t, buf.String(), "file=pipe-link type=FIFO")
}
