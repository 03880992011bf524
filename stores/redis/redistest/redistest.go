// Package redistest spawns a real redis-server for tests of code that uses
// the Redis store (stores/redis), and gives the conformance suite a harness
// over it.
//
// Running the conformance suite against it:
//
//	func TestStore(t *testing.T) {
//		conformance.RunStore(t, redistest.Start(t).HarnessMaker(1500*time.Millisecond))
//	}
//
// The binary is redis-server from PATH, or $REDIS_SERVER (Debian's
// redis-server package has one). When it is missing, [Start] fails the
// test if the environment has CI=true and skips it, loudly, otherwise: a
// CI run never passes by skipping the real server.
//
// The server runs on a free loopback port with its own temporary
// directory, configured entirely by command-line arguments, and is killed
// (with its whole process group) when the test that started it ends. It
// runs with the settings the driver requires of a production server
// (appendonly yes, appendfsync always), so the conformance suite's
// RequiredSettingsAreMet rule passes; [InMemory] drops them for speed, and
// that rule then fails, as it should.
package redistest

import (
	"testing"
	"time"

	"github.com/spate-go/spate/conformance"
	server "github.com/spate-go/spate/internal/redisservers"
)

// Server is a spawned redis-server.
type Server struct {
	s *server.Server
}

// Option configures a spawned server.
type Option func(*options)

type options struct{ inMemory bool }

// InMemory starts the server without persistence (no append-only file):
// faster, but not what the driver requires of a production server.
func InMemory() Option { return func(o *options) { o.inMemory = true } }

// Start spawns a server and kills it when t ends (t.Cleanup). Without a
// redis-server binary it fails t under CI=true and skips t otherwise.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.inMemory {
		return &Server{s: server.Start(t)}
	}
	return &Server{s: server.Start(t, server.WithAOF())}
}

// Addr is the server's host:port, for go-redis's Options.Addr. The client
// is the caller's to close: a store made over it with stores/redis.New
// never closes it.
func (s *Server) Addr() string { return s.s.Addr() }

// HarnessMaker returns a [conformance.HarnessMaker] over the server. Each
// harness has a fresh job and stores of TTL ttl. Each store the harness
// opens has a client of its own, as a separate process would;
// Harness.Close closes every store still open and every client, so the
// suite leaves no goroutine behind.
func (s *Server) HarnessMaker(ttl time.Duration) conformance.HarnessMaker {
	return s.s.HarnessMaker(ttl)
}
