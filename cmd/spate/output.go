package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gocloud.dev/blob"

	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/blobsink"
	"github.com/spate-go/spate/pipeline/filesource/blobsource"
)

// destination is a backfill's destination: a local directory (one file per
// split, DIR/<split>.out) or a bucket URL (parts per split,
// <split>/NNNNNNNN.out), both written exactly once.
type destination struct {
	// location names the destination in messages: the absolute directory,
	// or the bucket URL without its options (which may carry secrets).
	location string
	dir      string // absolute; empty for a bucket
	bucket   *blob.Bucket
}

// stagingSink is what a backfill writes through.
type stagingSink interface {
	pipeline.StagingSink
	pipeline.ChunkedSink
	Close() error
}

// openOutput opens dst without writing to it.
func openOutput(ctx context.Context, dst string) (*destination, error) {
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
// at rollSize bytes or rollInterval.
func (o *destination) sink(ctx context.Context, job string, rollSize int64, rollInterval time.Duration) (stagingSink, error) {
	if o.bucket != nil {
		s, err := blobsink.New(ctx, o.bucket, o.location, job)
		if err != nil {
			return nil, err
		}
		s.RollSize, s.RollInterval = rollSize, rollInterval
		return s, nil
	}
	return pipeline.NewStagedFileSink(o.dir, job)
}

// removeStaging removes the staged output nobody lists, once the job
// completed.
func (o *destination) removeStaging(ctx context.Context) error {
	if o.bucket != nil {
		return blobsink.RemoveStaging(ctx, o.bucket)
	}
	return pipeline.RemoveStaging(o.dir)
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

func (o *destination) close() error {
	if o.bucket != nil {
		return o.bucket.Close()
	}
	return nil
}
