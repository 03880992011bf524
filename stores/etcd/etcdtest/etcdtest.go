// Package etcdtest runs a real etcd server inside the test process for
// tests of code that uses the etcd store (stores/etcd), and gives the conformance suite a
// harness over it. The server is go.etcd.io/etcd/server/v3/embed: there is
// no binary to install, so nothing skips.
//
// Running the conformance suite against an embedded etcd:
//
//	func TestStore(t *testing.T) {
//		conformance.RunStore(t, etcdtest.Start(t).HarnessMaker(2*time.Second))
//	}
//
//	func TestCoordinator(t *testing.T) {
//		conformance.RunCoordinator(t, etcdtest.Start(t).HarnessMaker(2*time.Second))
//	}
//
// The server is one member on a free loopback port with a temporary data
// directory and raft timing ten times faster than etcd's defaults, so its
// minimum lease TTL is one second. It stops when the test that started it
// ends. Its logs are discarded unless the test runs with -v (warnings then
// go to stderr) or SPATE_ETCD_LOG names a zap level (debug, info, warn,
// error).
package etcdtest

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/spate-go/spate/conformance"
	cluster "github.com/spate-go/spate/internal/etcdservers"
)

// Server is a running embedded etcd server.
type Server struct {
	c *cluster.Cluster
}

// Start starts a server and stops it when t ends (t.Cleanup). It fails t
// if the server does not come up.
func Start(t testing.TB) *Server {
	t.Helper()
	return &Server{c: cluster.Start(t, cluster.Options{})}
}

// Endpoints are the server's client URLs.
func (s *Server) Endpoints() []string { return s.c.Endpoints() }

// ClientConfig is a client configuration for the server, for
// clientv3.New: its endpoints and a 5 s dial timeout. The client is the
// caller's to close: a store made over it with etcd.New never closes it.
func (s *Server) ClientConfig() clientv3.Config { return s.c.ClientConfig() }

// HarnessMaker returns a [conformance.HarnessMaker] over the server. Each
// harness has a fresh key prefix and stores of TTL ttl, which must be a
// whole number of seconds (etcd leases have one-second resolution); 2 s
// keeps the suite's expiry waits short. Each store the harness opens has
// a client of its own, as a separate process would, and closing the store
// closes that client. Harness.Close closes any client left open and deletes
// the prefix, so the suite leaves no goroutine or key behind.
func (s *Server) HarnessMaker(ttl time.Duration) conformance.HarnessMaker {
	return func(t testing.TB) conformance.Harness { return s.c.NewHarness(t, ttl) }
}
