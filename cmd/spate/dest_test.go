package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --dst, --data-dir and --history inside --src are refused however they
// are reached: through a symbolic link to --src (or to a directory inside
// it), and before the directory they name exists.
func TestBackfillEndsOverlapThroughLinks(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	writeCorpus(t, src, 1, 3)
	link := filepath.Join(dir, "link")
	require.NoError(t, os.Symlink(src, link))
	elsewhere := filepath.Join(dir, "elsewhere")
	require.NoError(t, os.Mkdir(elsewhere, 0o755))
	linkToOut := filepath.Join(dir, "out-link") // a link, in the parent of --dst, to a directory of --src
	require.NoError(t, os.Symlink(filepath.Join(src, "part-0"), linkToOut))

	in, err := openInput(context.Background(), src)
	require.NoError(t, err)
	defer in.close()
	overlap := func(dst, dataDir, history string) string {
		t.Helper()
		out, err := openOutput(context.Background(), dst)
		require.NoError(t, err)
		f := backfillFlags{history: history}
		f.store.dataDir = dataDir
		return f.endsOverlap(in, out)
	}
	safe := filepath.Join(elsewhere, "dst")
	data := filepath.Join(elsewhere, "etcd")
	assert.Empty(t, overlap(safe, data, ""), "separate ends refused")
	assert.Empty(t, overlap(safe, data, filepath.Join(elsewhere, "h.jsonl")), "a history elsewhere refused")
	for _, dst := range []string{
		filepath.Join(src, "out"),
		filepath.Join(link, "out"),
		filepath.Join(link, "new", "deeper"),
		filepath.Join(linkToOut, "out"),
		link,
	} {
		assert.Contains(t, overlap(dst, data, ""), "--src and --dst must not contain each other", "--dst %s", dst)
	}
	// A --dst that holds --src through a link is refused too.
	dstLink := filepath.Join(elsewhere, "dst-link")
	require.NoError(t, os.Symlink(dir, dstLink))
	assert.Contains(t, overlap(dstLink, data, ""), "--src and --dst must not contain each other")

	assert.Contains(t, overlap(safe, filepath.Join(link, "etcd"), ""), "--data-dir "+filepath.Join(link, "etcd")+" is inside --src")
	for _, h := range []string{filepath.Join(src, "h.jsonl"), filepath.Join(link, "sub", "h.jsonl")} {
		assert.Contains(t, overlap(safe, data, h), "--history "+h+" is inside --src", "--history %s", h)
	}
}
