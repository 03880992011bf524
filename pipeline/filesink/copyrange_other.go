//go:build !linux

package filesink

import "os"

func copyRange(dst *os.File, off int64, src *os.File, from, n int64) error {
	return copyRangeRW(dst, off, src, from, n)
}

// reserve is a no-op where fallocate is not available: a failed write is
// undone instead.
func reserve(*os.File, int64, int64) error { return nil }
