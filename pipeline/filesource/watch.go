package filesource

import (
	"context"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/fsnotify/fsnotify"
)

// watchDir watches root and its subdirectories for files that appear (a
// create, or a rename into them) and calls ask for each; a new
// subdirectory is watched too. It returns the watcher to close once ctx
// ends, or nil where the platform has no watch (or its limits are
// reached): then the listings at --discover and at the replan interval
// find new files, and an INFO line says so.
func watchDir(ctx context.Context, root string, log *slog.Logger, ask func()) *fsnotify.Watcher {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		log.Info("no file-system watch of the followed input: new files are found by the periodic listings (--discover) only", "src", root, "err", err)
		return nil
	}
	add := func(dir string) {
		_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			if err := w.Add(path); err != nil {
				log.Info("a directory of the followed input is not watched: its new files are found by the periodic listings (--discover) only", "dir", path, "err", err)
			}
			return nil
		})
	}
	add(root)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if !ev.Has(fsnotify.Create) {
					continue // growth is the lanes'; a rename away is the renamed file's lane's
				}
				if info, err := lstatDir(ev.Name); err == nil && info {
					add(ev.Name)
				}
				ask()
			case _, ok := <-w.Errors:
				if !ok {
					return
				}
				ask() // an overflow: events were lost, list to be sure
			}
		}
	}()
	return w
}

// lstatDir reports whether path is a directory (not through a link).
func lstatDir(path string) (bool, error) {
	info, err := os.Lstat(path)
	if err != nil {
		return false, err
	}
	return info.IsDir(), nil
}
