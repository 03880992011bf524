// Package natstest runs a real nats-server with JetStream inside the test
// process for tests of code that uses the NATS store (stores/nats), and
// gives the conformance suite a harness over it. The server is
// github.com/nats-io/nats-server/v2: there is no binary to install, so
// nothing skips.
//
// Running the conformance suite against it:
//
//	func TestStore(t *testing.T) {
//		conformance.RunStore(t, natstest.Start(t).HarnessMaker(2*time.Second))
//	}
//
// The server listens on a free loopback port with a temporary store
// directory, and shuts down when the test that started it ends.
package natstest

import (
	"testing"
	"time"

	"github.com/spate-go/spate/conformance"
	server "github.com/spate-go/spate/internal/natsservers"
	spatenats "github.com/spate-go/spate/stores/nats"
)

// Server is a running in-process nats-server.
type Server struct {
	s *server.Server
}

// Start starts a server and shuts it down when t ends (t.Cleanup). It
// fails t if the server does not come up.
func Start(t testing.TB) *Server {
	t.Helper()
	return &Server{s: server.Start(t)}
}

// URL is the server's client URL, for nats.Connect. The connection is the
// caller's to close: a store made over it with stores/nats.New never
// closes it.
func (s *Server) URL() string { return s.s.URL }

// HarnessMaker returns a [conformance.HarnessMaker] over the server. Each
// harness has a fresh job (its own buckets) and stores of lease TTL ttl,
// at least the driver's floor of 2 s. Each store the harness opens has a
// connection of its own, as a separate process would; Harness.Close closes
// every store still open and every connection, so the suite leaves no
// goroutine behind.
func (s *Server) HarnessMaker(ttl time.Duration) conformance.HarnessMaker {
	return func(t testing.TB) conformance.Harness {
		return s.s.Harness(t, spatenats.Options{TTL: ttl})
	}
}
