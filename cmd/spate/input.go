package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline/filesource"
	"github.com/spate-go/spate/pipeline/filesource/blobsource"
)

// input is a backfill's source: a local directory, or a bucket URL opened
// with the Go CDK (the schemes linked into this binary: see buckets*.go).
type input struct {
	objs filesource.Objects
	// location names the input in messages and in the derived job name:
	// the absolute directory, or the bucket URL without its options.
	location string
	// dir is the absolute directory; empty for a bucket.
	dir string
	// arg is --src as a command spate suggests passes it: the location,
	// or a table's URL with its password masked ("" for the location).
	arg string
	// table is a postgres:// table (objs is nil then).
	table *tableInput
	close func() error
}

// shownArg is what a suggested command passes as --src.
func (in *input) shownArg() string {
	if in.arg != "" {
		return in.arg
	}
	return in.location
}

// amount renders n of the input's unit, as the job's split weights count
// it: rows of a table, bytes of files.
func (in *input) amount(n int64) string {
	if in.table != nil {
		return count(n) + " rows"
	}
	return bytesStr(n)
}

// unit names a record of the input: a row of a table, a line of a file.
func (in *input) unit() string {
	if in.table != nil {
		return "rows"
	}
	return "lines"
}

// realDir is the directory with every symbolic link resolved (dir when
// that fails).
func (in *input) realDir() string {
	if r, err := filepath.EvalSymlinks(in.dir); err == nil {
		return r
	}
	return in.dir
}

// isBucketURL reports whether src is scheme://… rather than a path.
func isBucketURL(src string) bool {
	scheme, _, ok := strings.Cut(src, "://")
	if !ok || scheme == "" {
		return false
	}
	for _, c := range scheme {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// inputLocation is the location openInput would give src, without opening
// it: what a job name is derived from.
func inputLocation(src string) (string, error) {
	if isTableURL(src) {
		tu, err := parseTableURL(src, true)
		if err != nil {
			return "", err
		}
		return tu.location, nil
	}
	if isBucketURL(src) {
		return blobsource.Location(src)
	}
	return filepath.Abs(src)
}

// openInput opens --src; a directory's skipped special files are warned
// about on the default logger (see openInputLog).
func openInput(ctx context.Context, src string) (*input, error) {
	return openInputLog(ctx, src, nil)
}

// openInputLog opens --src; a directory's skipped special files (FIFOs,
// sockets, devices) are each named once in a warning on log, the job's
// logger (nil: the default logger).
func openInputLog(ctx context.Context, src string, log *slog.Logger) (*input, error) {
	if isTableURL(src) {
		return openTableInput(ctx, src)
	}
	if isBucketURL(src) {
		objs, closeBucket, err := blobsource.OpenURL(ctx, src)
		if err != nil {
			return nil, fmt.Errorf("%w (bucket schemes in this build: %s)", err, strings.Join(bucketSchemes, ", "))
		}
		return &input{objs: objs, location: objs.Location(), close: closeBucket}, nil
	}
	abs, err := inputLocation(src)
	if err != nil {
		return nil, err
	}
	if st, err := os.Stat(abs); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("%s is not a directory (nor a bucket URL such as file:///path or s3://bucket?region=…)", src)
	}
	objs := dirInput{Objects: filesource.Dir(abs), root: abs, skips: &filesource.SkipLog{Logger: log}}
	// Listed once here, so that a link spate cannot follow is refused
	// before anything starts rather than by the planner.
	if _, err := objs.List(ctx); err != nil {
		// For people: the reason, without the class spate's errors start
		// with (a listing that failed is Retryable to the planner, which
		// lists again; here it is refused).
		return nil, errors.New(plainMessage(err.Error()))
	}
	return &input{objs: objs, location: abs, dir: abs, close: func() error { return nil }}, nil
}

// dirInput is a local --src directory: its regular files, found
// recursively, and the regular files symbolic links in it point to (under
// the link's name; the directory itself may be a link too). A link to a
// directory, or one whose target is missing, is an error: following
// directory links could loop or read a file twice, and skipping them would
// leave input out silently. Other special files (devices, pipes, sockets)
// are skipped, never opened, each named once in a warning.
type dirInput struct {
	filesource.Objects // Location and Open: os.Open follows links
	root               string
	skips              *filesource.SkipLog
	// entered, if set, is called with each entry's path after its
	// directory was read and before the entry is looked at: a test's way
	// to rename or delete the file in between, as logrotate may.
	entered func(path string)
}

// LocalRoot implements filesource.LocalDir: a directory's files can be
// followed (spate backfill --follow).
func (d dirInput) LocalRoot() string { return d.root }

// List lists the files as filesource.Dir does, following links to regular
// files.
func (d dirInput) List(ctx context.Context) ([]filesource.Member, error) {
	walkRoot, err := filepath.EvalSymlinks(d.root)
	if err != nil {
		return nil, spate.Retryablef("list %s: %w", d.root, err)
	}
	var out []filesource.Member
	err = filepath.WalkDir(walkRoot, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return spate.Retryablef("list %s: %w", d.root, err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(walkRoot, path)
		if err != nil {
			return err
		}
		if d.entered != nil {
			d.entered(path)
		}
		var info fs.FileInfo
		switch {
		case e.Type().IsRegular():
			info, err = e.Info()
			if errors.Is(err, fs.ErrNotExist) {
				d.gone(filepath.ToSlash(rel))
				return nil
			}
		case e.Type()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(path)
			if info, err = os.Stat(path); err != nil {
				if _, lerr := os.Lstat(path); errors.Is(lerr, fs.ErrNotExist) {
					d.gone(filepath.ToSlash(rel)) // the link itself went away
					return nil
				}
				var pe *fs.PathError
				if errors.As(err, &pe) {
					err = pe.Err
				}
				return spate.Fatalf("%s is a symbolic link to %s, which cannot be read (%w); remove the link or restore its target",
					rel, target, err)
			}
			if info.IsDir() {
				return spate.Fatalf("%s is a symbolic link to the directory %s: spate follows links to regular files only; "+
					"link the files, or copy the directory", rel, target)
			}
			if !info.Mode().IsRegular() {
				d.skip(filepath.ToSlash(rel), info.Mode())
				return nil
			}
		case e.IsDir():
			return nil
		default:
			d.skip(filepath.ToSlash(rel), e.Type())
			return nil
		}
		if err != nil {
			return spate.Retryablef("list %s: %w", d.root, err)
		}
		out = append(out, filesource.Member{Name: filepath.ToSlash(rel), Size: info.Size(), MTime: info.ModTime().UnixNano()})
		return nil
	})
	if err != nil {
		return nil, err
	}
	filesource.SortMembers(out)
	return out, nil
}

// gone notes, at debug level, that the file name was in the directory
// when it was read and was renamed or deleted before it could be looked
// at: logrotate at work, normal. It is left out of this listing; the next
// one finds it under its new name, if it has one.
func (d dirInput) gone(name string) {
	log := slog.Default()
	if d.skips != nil && d.skips.Logger != nil {
		log = d.skips.Logger
	}
	log.Debug("a file was renamed or deleted while its directory was listed; the next listing finds it under its new name",
		"file", name)
}

// skip warns, once per file, that a special file is not read.
func (d dirInput) skip(name string, mode fs.FileMode) {
	if d.skips != nil {
		d.skips.Skip(name, mode)
	}
}
