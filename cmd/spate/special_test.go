//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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

// The warning about a special file in --src goes to the job's logger, in
// the format the operator chose, not to the process's default logger: with
// --log-format json it is a JSON record naming the file.
func TestBackfillWarnsOfSpecialFilesOnTheJobsLogger(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	lines := writeCorpus(t, src, 2, 100)
	require.NoError(t, syscall.Mkfifo(filepath.Join(src, "pipe"), 0o644))
	code, out, errOut := runSpate(t, dir, "", 60*time.Second, "backfill", "--src", src, "--dst", filepath.Join(dir, "dst"),
		"--store", "mem://", "--lease", "1s", "--log-format", "json")
	expectCode(t, "backfill over a FIFO", code, 0, out, errOut)
	require.Contains(t, out, "verified exactly once: all "+count(int64(lines))+" input lines", "not verified:\n%s", out)
	var warned []map[string]any
	for _, line := range strings.Split(errOut, "\n") {
		if !strings.Contains(line, "not a regular file") {
			continue
		}
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "the special-file warning is not a record of the job's JSON log: %q", line)
		warned = append(warned, rec)
	}
	require.Len(t, warned, 1, "stderr:\n%s", errOut)
	require.Equal(t, "WARN", warned[0]["level"])
	require.Equal(t, "pipe", warned[0]["file"])
	require.Equal(t, "FIFO", warned[0]["type"])
}
