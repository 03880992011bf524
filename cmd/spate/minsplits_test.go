package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/pipeline/filesource"
)

// At the defaults, 24 equal files are planned into at least
// DefaultMinSplits splits (the packing of 16 files a split made 2, and a
// fleet of 3 had a worker idle), and a file larger than a split's share is
// read as line-aligned ranges: every line exactly once, verified.
func TestBackfillDefaultsPlanAtLeastMinSplits(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		sizes []int // lines per file
	}{
		{"24 equal files", []int{1500, 1500, 1500, 1500, 1500, 1500, 1500, 1500, 1500, 1500, 1500, 1500, 1500, 1500, 1500, 1500, 1500, 1500, 1500, 1500, 1500, 1500, 1500, 1500}},
		{"one large file and 4 small", []int{30000, 300, 300, 300, 300}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			src := filepath.Join(dir, "src")
			require.NoError(t, os.MkdirAll(src, 0o755))
			lines := 0
			for i, n := range c.sizes {
				var b strings.Builder
				for j := range n {
					fmt.Fprintf(&b, "file %02d line %05d %s\n", i, j, strings.Repeat("z", j%37))
				}
				lines += n
				require.NoError(t, os.WriteFile(filepath.Join(src, fmt.Sprintf("f%02d.log", i)), []byte(b.String()), 0o644))
			}
			code, out, errOut := runSpate(t, dir, "", 90*time.Second, "backfill", "--src", src, "--dst", filepath.Join(dir, "dst"),
				"--store", "mem://", "--lease", "1s")
			expectCode(t, "backfill at the defaults", code, 0, out, errOut)
			require.Contains(t, out, "verified exactly once: all "+count(int64(lines))+" input lines", "not verified:\n%s", out)
			gained := regexp.MustCompile(`(?m)gained (f1\S+) `).FindAllStringSubmatch(out+errOut, -1)
			splits := map[string]bool{}
			for _, m := range gained {
				splits[m[1]] = true
			}
			require.GreaterOrEqual(t, len(splits), filesource.DefaultMinSplits, "splits gained:\n%s", out)
		})
	}
}
