//go:build linux

package filesource

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// identify is the identity of the file at path (links followed): its
// device and inode, and its birth time where the filesystem records one,
// so that an inode reused by a later file is a different identity.
func identify(path string) (FileID, error) {
	var stx unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_INO|unix.STATX_BTIME, &stx)
	if err != nil {
		return FileID{}, &os.PathError{Op: "statx", Path: path, Err: err}
	}
	id := FileID{Dev: unix.Mkdev(stx.Dev_major, stx.Dev_minor), Ino: stx.Ino}
	if stx.Mask&unix.STATX_BTIME != 0 {
		id.Birth = stx.Btime.Sec*1e9 + int64(stx.Btime.Nsec)
	}
	return id, nil
}

// identifyOpen is identify for an open file.
func identifyOpen(f *os.File) (FileID, error) {
	var stx unix.Statx_t
	err := unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_INO|unix.STATX_BTIME, &stx)
	if err != nil {
		return FileID{}, &os.PathError{Op: "statx", Path: f.Name(), Err: err}
	}
	id := FileID{Dev: unix.Mkdev(stx.Dev_major, stx.Dev_minor), Ino: stx.Ino}
	if stx.Mask&unix.STATX_BTIME != 0 {
		id.Birth = stx.Btime.Sec*1e9 + int64(stx.Btime.Nsec)
	}
	return id, nil
}

// links is an open file's link count: 0 once it is deleted.
func links(info os.FileInfo) (uint64, bool) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return uint64(st.Nlink), true
}
