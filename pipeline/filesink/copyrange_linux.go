package filesink

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

// reserve allocates f's blocks for [off, off+n) without changing its size
// (fallocate with FALLOC_FL_KEEP_SIZE), so that a full disk fails the
// reservation, before any byte is written, rather than the write halfway.
// A filesystem that cannot reserve is no error: the write is then
// undone if it fails.
func reserve(f *os.File, off, n int64) error {
	for {
		err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, off, n)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) || errors.Is(err, unix.EFBIG):
			return err
		default:
			return nil // not supported here (EOPNOTSUPP, ENOSYS, ...)
		}
	}
}
