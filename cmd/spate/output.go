package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	"github.com/spate-go/spate/internal/atomicfile"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/blobsink"
	"github.com/spate-go/spate/pipeline/filesink"
	"github.com/spate-go/spate/pipeline/filesource/blobsource"
)

// destination is a backfill's destination: a local directory (one file per
// split, DIR/<split>.out) or a bucket URL (parts per split,
// <split>/NNNNNNNN.out), both written exactly once.
type destination struct {
	// location names the destination in messages: the absolute directory,
	// or the bucket URL without its options (which may carry secrets).
	location string
	dir      string // absolute; empty for a bucket or a table
	bucket   *blob.Bucket
	// table is a postgres:// table: its rows are written by pgsink,
	// fenced in the database (the fence table binds it to its job).
	table *tableOutput
}

// shownArg is what a suggested command passes as --dst.
func (o *destination) shownArg() string {
	if o.table != nil {
		return o.table.url.shown
	}
	return o.location
}

// stagingSink is what a backfill writes through.
type stagingSink interface {
	pipeline.StagingSink
	pipeline.ChunkedSink
	Close() error
}

// openOutput opens dst without writing to it.
func openOutput(ctx context.Context, dst string) (*destination, error) {
	if isTableURL(dst) {
		tu, err := parseTableURL(dst, false)
		if err != nil {
			return nil, err
		}
		return &destination{location: tu.location, table: &tableOutput{url: tu}}, nil
	}
	if isBucketURL(dst) {
		loc, err := blobsource.Location(dst)
		if err != nil {
			return nil, err
		}
		b, err := blob.OpenBucket(ctx, dst)
		if err != nil {
			return nil, fmt.Errorf("%w (bucket schemes in this build: %s)", err, strings.Join(bucketSchemes, ", "))
		}
		return &destination{location: loc, bucket: b}, nil
	}
	abs, err := filepath.Abs(dst)
	if err != nil {
		return nil, err
	}
	return &destination{location: abs, dir: abs}, nil
}

// sink creates the destination's staging sink for job (creating a
// directory, claiming the destination for the job); a bucket's parts roll
// at rollSize bytes or rollInterval; a directory's files are published
// whole at their split's completion when whole is set (--publish
// complete).
func (o *destination) sink(ctx context.Context, job string, rollSize int64, rollInterval time.Duration, whole bool) (stagingSink, error) {
	if o.table != nil {
		if o.table.sink == nil {
			return nil, fmt.Errorf("destination table %s: not opened for job %s", o.location, job)
		}
		return tableSink{o.table.sink}, nil
	}
	if o.bucket != nil {
		s, err := blobsink.New(ctx, o.bucket, o.location, job)
		if err != nil {
			return nil, err
		}
		s.RollSize, s.RollInterval = rollSize, rollInterval
		return s, nil
	}
	s, err := filesink.NewStagedFileSink(o.dir, job)
	if err != nil {
		return nil, err
	}
	s.PublishWhole = whole
	return s, nil
}

// removeStaging removes the staged output nobody lists, once the job
// completed.
func (o *destination) removeStaging(ctx context.Context) error {
	if o.table != nil {
		return nil // the sink's CleanJob removes the job's fence rows
	}
	if o.bucket != nil {
		return blobsink.RemoveStaging(ctx, o.bucket)
	}
	return filesink.RemoveStaging(o.dir)
}

// eachOutput calls fn with every published output file or part, in name
// order (the staging area excluded).
func (o *destination) eachOutput(ctx context.Context, fn func(name string, r io.Reader) error) error {
	if o.bucket == nil {
		paths, err := filepath.Glob(filepath.Join(o.dir, "*"+outputSuffix))
		if err != nil {
			return err
		}
		for _, p := range paths {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			err = fn(p, f)
			f.Close()
			if err != nil {
				return err
			}
		}
		return nil
	}
	var keys []string
	it := o.bucket.List(&blob.ListOptions{})
	for {
		obj, err := it.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("list %s: %w", o.location, err)
		}
		if obj.IsDir || strings.HasPrefix(obj.Key, ".spate/") || !strings.HasSuffix(obj.Key, outputSuffix) {
			continue
		}
		keys = append(keys, obj.Key)
	}
	slices.Sort(keys)
	for _, k := range keys {
		r, err := o.bucket.NewReader(ctx, k, nil)
		if err != nil {
			return fmt.Errorf("read %s%s: %w", o.location, k, err)
		}
		err = fn(o.location+k, r)
		r.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// destBinding binds a destination to the plan that writes it: the job's
// name and the plan's identity on the store that holds it (see
// planParams), recorded in DST/.spate/plan when a worker first writes to
// it. A plan's commits name bytes of its own output only, so output
// another plan wrote (another store's, or one since wiped) would be
// published again next to it: such a destination is refused.
type destBinding struct {
	V     int    `json:"v"`
	Job   string `json:"job"`
	Plan  string `json:"plan"`  // planParams.Plan of the job on its store
	Store string `json:"store"` // the store, for people
	Src   string `json:"src"`
	At    string `json:"bound_at"`
}

const (
	bindingKey = ".spate/plan" // the binding, relative to the destination
	jobKey     = ".spate/job"  // the staging sinks' job marker
)

// readMeta reads the destination's file rel (a key of the bucket); ok is
// false when it is absent.
func (o *destination) readMeta(ctx context.Context, rel string) (data []byte, ok bool, err error) {
	if o.bucket != nil {
		data, err = o.bucket.ReadAll(ctx, rel)
		if gcerrors.Code(err) == gcerrors.NotFound {
			return nil, false, nil
		}
	} else {
		data, err = os.ReadFile(filepath.Join(o.dir, filepath.FromSlash(rel)))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, false, nil
		}
	}
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", o.metaName(rel), err)
	}
	return data, true, nil
}

// metaName names the destination's file rel in messages.
func (o *destination) metaName(rel string) string {
	if o.bucket != nil {
		return o.location + rel
	}
	return filepath.Join(o.dir, filepath.FromSlash(rel))
}

// readBinding reads the destination's binding; ok is false when it has
// none.
func (o *destination) readBinding(ctx context.Context) (b destBinding, ok bool, err error) {
	data, ok, err := o.readMeta(ctx, bindingKey)
	if !ok || err != nil {
		return b, false, err
	}
	if err := json.Unmarshal(data, &b); err != nil || b.Plan == "" {
		return b, false, fmt.Errorf("%s is not a binding spate wrote (%v): restore it, or give the job another --dst", o.metaName(bindingKey), err)
	}
	return b, true, nil
}

// markedJob is the job the destination's job marker names ("" when it
// has none).
func (o *destination) markedJob(ctx context.Context) (string, error) {
	data, _, err := o.readMeta(ctx, jobKey)
	return string(bytes.TrimSpace(data)), err
}

// bind records b as the destination's binding, unless it has one: then
// that one is returned (a worker started at the same moment wrote it).
// The binding appears whole or not at all.
func (o *destination) bind(ctx context.Context, b destBinding) (destBinding, error) {
	data, err := json.Marshal(b)
	if err != nil {
		return b, err
	}
	data = append(data, '\n')
	if o.bucket != nil {
		err = o.bucket.WriteAll(ctx, bindingKey, data, &blob.WriterOptions{IfNotExist: true, ContentType: "application/json"})
		if code := gcerrors.Code(err); code == gcerrors.FailedPrecondition || code == gcerrors.AlreadyExists {
			err = fs.ErrExist
		}
	} else {
		err = writeNew(filepath.Join(o.dir, filepath.FromSlash(bindingKey)), data)
	}
	if errors.Is(err, fs.ErrExist) {
		got, ok, err := o.readBinding(ctx)
		if err == nil && !ok {
			err = fmt.Errorf("%s vanished as it was written", o.metaName(bindingKey))
		}
		return got, err
	}
	if err != nil {
		return b, fmt.Errorf("cannot write %s: %w (is --dst writable?)", o.metaName(bindingKey), err)
	}
	return b, nil
}

// writeNew writes data to path, creating its directory, whole or not at
// all (atomicfile.WriteNew): it fails with fs.ErrExist if path exists.
func writeNew(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return atomicfile.WriteNew(path, data)
}

// hasOutput reports whether the destination holds a published output file
// or part.
func (o *destination) hasOutput(ctx context.Context) (bool, error) {
	if o.bucket == nil {
		paths, err := filepath.Glob(filepath.Join(o.dir, "*"+outputSuffix))
		return len(paths) > 0, err
	}
	it := o.bucket.List(&blob.ListOptions{})
	for {
		obj, err := it.Next(ctx)
		if errors.Is(err, io.EOF) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("list %s: %w", o.location, err)
		}
		if !obj.IsDir && !strings.HasPrefix(obj.Key, ".spate/") && strings.HasSuffix(obj.Key, outputSuffix) {
			return true, nil
		}
	}
}

func (o *destination) close() error {
	if o.table != nil && o.table.sink != nil {
		return o.table.sink.Close()
	}
	if o.bucket != nil {
		return o.bucket.Close()
	}
	return nil
}
