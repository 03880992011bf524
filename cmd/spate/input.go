package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

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
	dir   string
	close func() error
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
	if isBucketURL(src) {
		return blobsource.Location(src)
	}
	return filepath.Abs(src)
}

func openInput(ctx context.Context, src string) (*input, error) {
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
	return &input{objs: filesource.Dir(abs), location: abs, dir: abs, close: func() error { return nil }}, nil
}
