//go:build linux

package filesource_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/pipeline/filesource"
)

// Special files under a directory input (a FIFO, a socket) are not
// listed, never opened (a FIFO's open would block the listing), and each
// is named once in a warning, however often the input is listed.
func TestSpecialFilesAreSkippedWithAWarning(t *testing.T) {
	dir := t.TempDir()
	corpus(t, dir, map[string]string{"a.log": "x\n", "sub/b.log": "y\n"})
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "sub", "pipe"), 0o644))
	// A socket path must be short: listen from inside dir.
	wd, err := os.Getwd()
	require.NoError(t, err)
	require.NoError(t, os.Chdir(dir))
	ln, err := net.Listen("unix", "sock")
	require.NoError(t, os.Chdir(wd))
	require.NoError(t, err)
	defer ln.Close()

	// The listing warns through slog.Default.
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	defer slog.SetDefault(old)
	objs := filesource.Dir(dir)
	for range 3 {
		members, err := objs.List(context.Background())
		require.NoError(t, err)
		var names []string
		for _, m := range members {
			names = append(names, m.Name)
		}
		require.Equal(t, []string{"a.log", "sub/b.log"}, names)
	}
	warned := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, warned, 2, "one warning per special file, whatever the listings: %v", warned)
	for _, w := range warned {
		require.Contains(t, w, "level=WARN")
		require.Contains(t, w, "not a regular file")
	}
	require.Contains(t, buf.String(), "file=sock type=socket")
	require.Contains(t, buf.String(), "file=sub/pipe type=FIFO")
}
