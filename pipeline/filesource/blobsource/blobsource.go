// Package blobsource reads a backfill's input from a Go CDK bucket
// (gocloud.dev/blob): Amazon S3 and S3-compatible stores, Google Cloud
// Storage, Azure Blob Storage, a local directory (fileblob) or memory
// (memblob). It adapts a bucket to [filesource.Objects], so the planner,
// lanes, offsets and watermarks are exactly those of a directory backfill.
//
// The application links the bucket drivers it needs, the Go CDK way:
//
//	import _ "gocloud.dev/blob/s3blob"
//
//	objs, closeBucket, err := blobsource.OpenURL(ctx, "s3://my-bucket?region=eu-west-1&prefix=logs/")
//	...
//	src := filesource.New(objs, coord, filesource.PlannerOptions{})
//
// Object keys become member names as they are (relative to the bucket, or to
// its prefix= when the URL has one). An object's modification time and size
// from the listing identify it in the split id, as a file's do. Keys ending
// in '/' (directory markers) are skipped.
package blobsource

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/url"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline/filesource"
)

// Objects is a bucket as a backfill input.
type Objects struct {
	b        *blob.Bucket
	location string
}

var _ filesource.Objects = (*Objects)(nil)

// New adapts b. location names the input in the job's fingerprint (every
// worker of one job must pass the same); [OpenURL] passes the URL without
// its query.
func New(b *blob.Bucket, location string) *Objects {
	return &Objects{b: b, location: location}
}

// OpenURL opens the bucket at rawURL with the Go CDK's URL openers (the
// driver for its scheme must be linked) and returns it as an input named
// [Location](rawURL), with a function that closes the bucket.
func OpenURL(ctx context.Context, rawURL string) (*Objects, func() error, error) {
	location, err := Location(rawURL)
	if err != nil {
		return nil, nil, err
	}
	b, err := blob.OpenBucket(ctx, rawURL)
	if err != nil {
		return nil, nil, fmt.Errorf("blobsource: open %s: %w: %w", rawURL, err, spate.ErrFatal)
	}
	return New(b, location), b.Close, nil
}

// Location is the name a bucket URL gives its input: the URL without user
// information and options, except the prefix= option, which selects the
// input (a region, an endpoint or credentials do not change what is read).
func Location(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme == "" {
		return "", fmt.Errorf("blobsource: %q is not a bucket URL (scheme://bucket[?options]): %w", rawURL, spate.ErrFatal)
	}
	loc := *u
	loc.RawQuery, loc.User, loc.Fragment = "", nil, ""
	location := loc.String()
	if prefix := u.Query().Get("prefix"); prefix != "" {
		location += "?prefix=" + prefix
	}
	return location, nil
}

// Location implements [filesource.Objects].
func (o *Objects) Location() string { return o.location }

// List implements [filesource.Objects]: every object of the bucket, sorted
// by key. A listing error is Retryable.
func (o *Objects) List(ctx context.Context) ([]filesource.Member, error) {
	var out []filesource.Member
	it := o.b.List(nil)
	for {
		obj, err := it.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, spate.Retryablef("blobsource: list %s: %w", o.location, err)
		}
		if obj.IsDir || len(obj.Key) == 0 || obj.Key[len(obj.Key)-1] == '/' {
			continue
		}
		out = append(out, filesource.Member{Name: obj.Key, Size: obj.Size, MTime: obj.ModTime.UnixNano()})
	}
	filesource.SortMembers(out)
	return out, nil
}

// Open implements [filesource.Objects] with a range read from offset. A
// missing object's error matches [fs.ErrNotExist].
func (o *Objects) Open(ctx context.Context, name string, offset int64) (io.ReadCloser, int64, error) {
	r, err := o.b.NewRangeReader(ctx, name, offset, -1, nil)
	if err != nil {
		if gcerrors.Code(err) == gcerrors.NotFound {
			return nil, 0, fmt.Errorf("%s: %w (%w)", name, fs.ErrNotExist, err)
		}
		return nil, 0, fmt.Errorf("%s: %w", name, err)
	}
	return r, r.Size(), nil
}
