// Package natsservers runs nats-server in-process for tests: one server with
// JetStream on a free loopback port and a temporary store directory, with
// optional authentication (user/password, token, nkey, operator-signed
// credentials) and TLS (a throwaway CA made in Go), or a JetStream cluster
// whose nodes a test can stop and restart. Everything shuts down at test
// cleanup. It needs no nats-server binary.
package natsservers

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
)

// readyWait bounds a server's start.
const readyWait = 20 * time.Second

// Option configures a server.
type Option func(*config)

type config struct {
	user, password string
	token          string
	nkey           bool
	creds          bool
	tls            bool
	mutualTLS      bool
	syncAlways     bool
	maxPayload     int32
	perms          *server.Permissions
}

// WithUserPassword requires user/password authentication.
func WithUserPassword(user, password string) Option {
	return func(c *config) { c.user, c.password = user, password }
}

// WithPermissions gives the user/password user (see [WithUserPassword])
// exactly the subject permissions p.
func WithPermissions(p *server.Permissions) Option {
	return func(c *config) { c.perms = p }
}

// WithToken requires token authentication.
func WithToken(token string) Option { return func(c *config) { c.token = token } }

// WithNkey requires nkey authentication with a generated user key; its seed
// is written to [Server.NkeySeedFile].
func WithNkey() Option { return func(c *config) { c.nkey = true } }

// WithCreds runs the server in operator mode (JWT accounts in a memory
// resolver, a system account) and writes a user's .creds file to
// [Server.CredsFile].
func WithCreds() Option { return func(c *config) { c.creds = true } }

// WithTLS serves TLS with a certificate from a throwaway CA
// ([Server.CAFile]); mutual also requires a client certificate
// ([Server.CertFile], [Server.KeyFile]).
func WithTLS(mutual bool) Option {
	return func(c *config) { c.tls, c.mutualTLS = true, mutual }
}

// WithSyncAlways makes JetStream fsync every write before acknowledging it
// (`sync_interval: always`), as production needs.
func WithSyncAlways() Option { return func(c *config) { c.syncAlways = true } }

// WithMaxPayload caps the size of a message the server accepts
// (`max_payload`; the default is 1 MiB).
func WithMaxPayload(n int32) Option { return func(c *config) { c.maxPayload = n } }

// Server is a running (or stopped) in-process nats-server.
type Server struct {
	t   testing.TB
	cfg config

	name        string
	port        int // fixed after the first start so restarts keep the URL
	storeDir    string
	clusterName string
	clusterPort int
	routes      []*url.URL
	auth        authMaterial

	// URL is the client URL.
	URL string
	// ClientOptions authenticate a client and set up its TLS.
	ClientOptions []natsgo.Option
	// Files written for clients, when the matching option is on.
	CAFile, CertFile, KeyFile, CredsFile, NkeySeedFile string

	mu  sync.Mutex
	srv *server.Server
}

// Start runs a single server with JetStream and shuts it down at cleanup.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s := newServer(t, "solo", opts)
	s.start(t)
	t.Cleanup(s.Shutdown)
	return s
}

func newServer(t testing.TB, name string, opts []Option) *Server {
	t.Helper()
	s := &Server{t: t, name: name, port: -1, storeDir: t.TempDir()}
	for _, o := range opts {
		o(&s.cfg)
	}
	dir := t.TempDir()
	if s.cfg.tls {
		if err := s.makeTLS(dir); err != nil {
			t.Fatalf("natsservers: TLS material: %v", err)
		}
	}
	if err := s.makeAuth(dir); err != nil {
		t.Fatalf("natsservers: auth material: %v", err)
	}
	return s
}

func (s *Server) options() (*server.Options, error) {
	o := &server.Options{
		ServerName:             s.name,
		Host:                   "127.0.0.1",
		Port:                   s.port,
		NoLog:                  true,
		NoSigs:                 true,
		JetStream:              true,
		StoreDir:               s.storeDir,
		JetStreamMaxMemory:     256 << 20,
		JetStreamMaxStore:      1 << 30,
		DisableJetStreamBanner: true,
		SyncAlways:             s.cfg.syncAlways,
		MaxPayload:             s.cfg.maxPayload,
	}
	if s.clusterName != "" {
		o.Cluster = server.ClusterOpts{Name: s.clusterName, Host: "127.0.0.1", Port: s.clusterPort}
		o.Routes = s.routes
	}
	if err := s.applyAuth(o); err != nil {
		return nil, err
	}
	if s.cfg.tls {
		if err := s.applyTLS(o); err != nil {
			return nil, err
		}
	}
	return o, nil
}

func (s *Server) start(t testing.TB) {
	t.Helper()
	if err := s.tryStart(); err != nil {
		t.Fatalf("natsservers: %v", err)
	}
}

// errListen is a server's failure to bind one of its ports: one found free
// by [freeport] and taken by another process before the server bound it.
// [StartCluster] retries on fresh ports.
type errListen struct{ msg string }

func (e *errListen) Error() string { return e.msg }

// fatalCatcher passes the server's log on (to next, when the test asked for
// the logs) and reports its first fatal message, which nats-server logs
// instead of returning an error (a port it cannot bind, most often).
type fatalCatcher struct {
	next  server.Logger
	once  sync.Once
	fatal chan string
}

func (f *fatalCatcher) Fatalf(format string, v ...any) {
	f.once.Do(func() { f.fatal <- fmt.Sprintf(format, v...) })
	if f.next != nil {
		f.next.Errorf(format, v...)
	}
}

func (f *fatalCatcher) Noticef(format string, v ...any) {
	if f.next != nil {
		f.next.Noticef(format, v...)
	}
}

func (f *fatalCatcher) Warnf(format string, v ...any) {
	if f.next != nil {
		f.next.Warnf(format, v...)
	}
}

func (f *fatalCatcher) Errorf(format string, v ...any) {
	if f.next != nil {
		f.next.Errorf(format, v...)
	}
}

func (f *fatalCatcher) Debugf(format string, v ...any) {
	if f.next != nil {
		f.next.Debugf(format, v...)
	}
}

func (f *fatalCatcher) Tracef(format string, v ...any) {
	if f.next != nil {
		f.next.Tracef(format, v...)
	}
}

// tryStart runs the server and waits until it accepts connections. A fatal
// message from the server (it logs one, instead of returning an error, when
// it cannot bind a port) fails the start at once, as an *errListen when it
// is about a port.
func (s *Server) tryStart() error {
	o, err := s.options()
	if err != nil {
		return fmt.Errorf("server options: %w", err)
	}
	srv, err := server.NewServer(o)
	if err != nil {
		return fmt.Errorf("new server %s: %w", s.name, err)
	}
	catcher := &fatalCatcher{fatal: make(chan string, 1)}
	if os.Getenv("NATSTEST_LOG") != "" {
		// The servers' own logs on stderr, to debug a test.
		o.NoLog = false
		o.Debug = os.Getenv("NATSTEST_LOG") == "debug"
		srv.ConfigureLogger()
		catcher.next = srv.Logger()
	}
	srv.SetLogger(catcher, o.Debug, false)
	go srv.Start()
	deadline := time.Now().Add(readyWait)
	for !srv.ReadyForConnections(50 * time.Millisecond) {
		var failure error
		select {
		case msg := <-catcher.fatal:
			failure = fmt.Errorf("server %s: %s", s.name, msg)
			if strings.Contains(msg, "listening on") {
				failure = &errListen{msg: failure.Error()}
			}
		default:
			if time.Now().After(deadline) {
				failure = fmt.Errorf("server %s not ready within %v", s.name, readyWait)
			}
		}
		if failure != nil {
			srv.Shutdown()
			srv.WaitForShutdown()
			return failure
		}
	}
	addr := srv.Addr().(*net.TCPAddr)
	s.mu.Lock()
	s.srv = srv
	s.port = addr.Port
	scheme := "nats"
	if s.cfg.tls {
		scheme = "tls"
	}
	s.URL = fmt.Sprintf("%s://127.0.0.1:%d", scheme, addr.Port)
	s.mu.Unlock()
	return nil
}

// Shutdown stops the server and waits for it; its store directory stays, so
// [Server.Restart] brings it back with its data. Idempotent.
func (s *Server) Shutdown() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
}

// Restart starts a stopped server again on the same port and store.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	running := s.srv != nil
	s.mu.Unlock()
	if running {
		t.Fatalf("natsservers: restart of running server %s", s.name)
	}
	s.start(t)
}

// Running reports whether the server is up.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv != nil
}

// Name is the server's name (its JetStream peer name in a cluster).
func (s *Server) Name() string { return s.name }

// Version is the server's version string, as its INFO reports it.
func (s *Server) Version() string { return server.VERSION }

// Raw is the running nats-server, or nil.
func (s *Server) Raw() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv
}

// Connect opens a client connection with the server's client options and
// extra, and closes it at cleanup.
func (s *Server) Connect(t testing.TB, extra ...natsgo.Option) *natsgo.Conn {
	t.Helper()
	nc, err := natsgo.Connect(s.URL, s.clientOptions(extra)...)
	if err != nil {
		t.Fatalf("natsservers: connect to %s: %v", s.URL, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func (s *Server) clientOptions(extra []natsgo.Option) []natsgo.Option {
	opts := []natsgo.Option{natsgo.Name("natstest"), natsgo.MaxReconnects(-1), natsgo.ReconnectWait(50 * time.Millisecond)}
	opts = append(opts, s.ClientOptions...)
	return append(opts, extra...)
}

// Eventually polls cond every 20ms until it holds or d passes. Use it only
// for server state that has no event to wait on (a leader being elected).
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("natsservers: %s: not within %v", what, d)
		case <-tick.C:
		}
	}
}

func writeFile(dir, name string, data []byte) (string, error) {
	p := filepath.Join(dir, name)
	return p, os.WriteFile(p, data, 0o600)
}
