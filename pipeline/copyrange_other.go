//go:build !linux

package pipeline

import "os"

func copyRange(dst *os.File, off int64, src *os.File, from, n int64) error {
	return copyRangeRW(dst, off, src, from, n)
}
