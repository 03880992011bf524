// Package atomicfile writes small files whole or not at all, for the
// markers that bind a destination to its job and plan: a reader never sees
// one half-written, and of two writers racing for one name exactly one wins.
package atomicfile

import (
	"os"
	"path/filepath"
)

// WriteNew writes data to path, whose directory must exist, whole or not
// at all: under a name of its own beside path, fsynced, then hard-linked
// to path, and the directory fsynced. If path already exists it is left as
// it was and the error satisfies errors.Is(err, fs.ErrExist).
func WriteNew(path string, data []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
