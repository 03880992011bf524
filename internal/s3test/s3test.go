// Package s3test runs an in-process S3 server (gofakes3 over httptest) for
// tests: the real S3 wire protocol, reached through gocloud's s3blob.
package s3test

import (
	"context"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"gocloud.dev/blob"
	_ "gocloud.dev/blob/s3blob" // the s3:// scheme
)

// Server is one in-process S3 server.
type Server struct {
	Endpoint string // http://127.0.0.1:PORT
	backend  *s3mem.Backend
}

// Start starts a server that lives until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	backend := s3mem.New()
	ts := httptest.NewServer(gofakes3.New(backend).Server())
	t.Cleanup(ts.Close)
	return &Server{Endpoint: ts.URL, backend: backend}
}

// Bucket creates bucket and returns its s3:// URL (path style, anonymous
// credentials, this server's endpoint), with prefix if not empty.
func (s *Server) Bucket(t testing.TB, bucket, prefix string) string {
	t.Helper()
	if err := s.backend.CreateBucket(bucket); err != nil {
		t.Fatalf("s3test: create bucket %s: %v", bucket, err)
	}
	q := url.Values{}
	q.Set("endpoint", s.Endpoint)
	q.Set("use_path_style", "true")
	q.Set("region", "us-east-1")
	q.Set("anonymous", "true")
	if prefix != "" {
		q.Set("prefix", prefix)
	}
	return "s3://" + bucket + "?" + q.Encode()
}

// Open opens the bucket at rawURL; it is closed when the test ends.
func Open(t testing.TB, rawURL string) *blob.Bucket {
	t.Helper()
	b, err := blob.OpenBucket(context.Background(), rawURL)
	if err != nil {
		t.Fatalf("s3test: open %s: %v", rawURL, err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}
