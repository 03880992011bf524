package pipeline

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// copyRange copies src[from, from+n) to dst at off with copy_file_range
// (no pass through user space; a reflink where the filesystem can), or
// by reading and writing where the kernel cannot.
func copyRange(dst *os.File, off int64, src *os.File, from, n int64) error {
	for n > 0 {
		m, err := unix.CopyFileRange(int(src.Fd()), &from, int(dst.Fd()), &off, int(min(n, 1<<30)), 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
				return copyRangeRW(dst, off, src, from, n)
			}
			return err
		}
		if m == 0 {
			return errors.New("the staging file is shorter than its committed range")
		}
		n -= int64(m)
	}
	return nil
}
