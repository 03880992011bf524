package filesource

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/spate-go/spate"
)

// Objects is where a backfill's input lives: a directory ([Dir]) or a
// bucket (package blobsource adapts any Go CDK bucket). Names are
// slash-separated and relative to the root of the input.
type Objects interface {
	// Location names the input in the job's fingerprint: every worker of
	// one job must report the same string for the same input.
	Location() string
	// List returns every object with its size and modification time,
	// sorted by name. Its errors are classified (usually Retryable).
	List(ctx context.Context) ([]Member, error)
	// Open returns a reader of the object name from offset to its end, and
	// the object's current size. A missing object is an error.
	Open(ctx context.Context, name string, offset int64) (io.ReadCloser, int64, error)
}

// Dir is the input under a local directory: its regular files, found
// recursively (symbolic links are not followed). Other special files
// (FIFOs, sockets, devices) are skipped, never opened (opening a FIFO
// blocks): each is named once in a warning (slog.Default) the first time
// a listing skips it.
func Dir(root string) Objects { return dirObjects{root: root, skips: &SkipLog{}} }

type dirObjects struct {
	root  string
	skips *SkipLog
}

// Location is the directory's absolute path, slash-separated.
func (d dirObjects) Location() string {
	abs, err := filepath.Abs(d.root)
	if err != nil {
		abs = d.root
	}
	return filepath.ToSlash(abs)
}

func (d dirObjects) List(ctx context.Context) ([]Member, error) {
	return listFiles(ctx, d.root, d.skips)
}

func (d dirObjects) Open(_ context.Context, name string, offset int64) (io.ReadCloser, int64, error) {
	if !validRel(name) {
		return nil, 0, fmt.Errorf("filesource: %q is not a relative slash-separated path", name)
	}
	f, err := os.Open(filepath.Join(d.root, filepath.FromSlash(name)))
	if err != nil {
		return nil, 0, err
	}
	info, err := f.Stat()
	if err == nil {
		_, err = f.Seek(offset, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, info.Size(), nil
}

// validRel is fs.ValidPath without its UTF-8 rule: a file's name is any
// bytes but NUL and '/' on the systems spate runs on, and one that is not
// valid UTF-8 is still a file of the input. No element may be empty, "."
// or "..", so the name cannot leave the root.
func validRel(name string) bool {
	if name == "" || strings.IndexByte(name, 0) >= 0 {
		return false
	}
	for elem := range strings.SplitSeq(name, "/") {
		if elem == "" || elem == "." || elem == ".." {
			return false
		}
	}
	return true
}

// ListFiles lists the regular files under root, sorted by relative path.
// A special file (FIFO, socket, device) is skipped with a warning naming
// it (see [SkipLog]).
func ListFiles(ctx context.Context, root string) ([]Member, error) {
	return listFiles(ctx, root, &SkipLog{})
}

func listFiles(ctx context.Context, root string, skips *SkipLog) ([]Member, error) {
	var out []Member
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			if !d.IsDir() && d.Type()&fs.ModeSymlink == 0 {
				if rel, err := filepath.Rel(root, path); err == nil {
					skips.Skip(filepath.ToSlash(rel), d.Type())
				}
			}
			return nil
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil // removed since the directory was read (a rotation): not input
		}
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		out = append(out, Member{Name: filepath.ToSlash(rel), Size: info.Size(), MTime: info.ModTime().UnixNano()})
		return nil
	})
	if err != nil {
		return nil, spate.Retryablef("filesource: list %s: %w", root, err)
	}
	SortMembers(out)
	return out, nil
}

// SkipLog warns once per file that a listing skipped it because it is
// not a regular file: a FIFO, a socket or a device, which spate never
// opens (a FIFO's open blocks until a writer comes, a device may never
// end). The zero value logs to slog.Default().
type SkipLog struct {
	// Logger, if set, is where the warnings go.
	Logger *slog.Logger
	mu     sync.Mutex
	seen   map[string]bool
}

// Skip notes that the file name (relative to the input's root), of type
// mode, was skipped, and warns the first time.
func (s *SkipLog) Skip(name string, mode fs.FileMode) {
	s.mu.Lock()
	first := !s.seen[name]
	if s.seen == nil {
		s.seen = map[string]bool{}
	}
	s.seen[name] = true
	s.mu.Unlock()
	if !first {
		return
	}
	log := s.Logger
	if log == nil {
		log = slog.Default()
	}
	log.Warn("skipped a file of the input that is not a regular file: spate reads regular files only, and never opens a FIFO, socket or device",
		"file", quoteName(name), "type", specialKind(mode))
}

// specialKind names a special file's type.
func specialKind(mode fs.FileMode) string {
	switch {
	case mode&fs.ModeNamedPipe != 0:
		return "FIFO"
	case mode&fs.ModeSocket != 0:
		return "socket"
	case mode&fs.ModeCharDevice != 0:
		return "character device"
	case mode&fs.ModeDevice != 0:
		return "device"
	}
	return "irregular file (" + mode.Type().String() + ")"
}

// SortMembers orders members by name, byte-wise: the order splits are
// packed in.
func SortMembers(ms []Member) {
	slices.SortFunc(ms, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
}
