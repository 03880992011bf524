// Package redisservers spawns real redis-server processes for tests: each on a
// free loopback port with its own temporary directory, configured entirely
// by command-line arguments, stopped (its whole process group killed) when
// the test ends. Options add ACL users, TLS with throwaway certificates,
// AOF persistence and arbitrary server arguments; a server can be stopped,
// killed and started again on the same directory and port.
//
// The binary is redis-server from PATH, or $REDIS_SERVER. When it is
// missing a test fails if CI=true and is skipped, loudly, otherwise.
//
// [Server.NewHarness] gives the conformance suite a fresh job per harness
// over one server.
package redisservers

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/spate-go/spate/internal/needs"
)

// readyWait bounds how long a server may take to accept connections.
const readyWait = 20 * time.Second

// Option configures a server.
type Option func(*config)

type config struct {
	args    []string
	users   []user
	tls     bool
	aof     bool
	cluster bool
}

type user struct {
	name, password string
	rules          []string
}

// WithArgs appends raw redis-server arguments, e.g. "--rename-command",
// "EVAL", "".
func WithArgs(args ...string) Option {
	return func(c *config) { c.args = append(c.args, args...) }
}

// WithUser adds an ACL user with a password and ACL rules (e.g. "~spate:*",
// "+@all", "-eval"). The default user stays enabled without a password, so
// tests can inspect the server.
func WithUser(name, password string, rules ...string) Option {
	return func(c *config) { c.users = append(c.users, user{name, password, rules}) }
}

// WithTLS serves TLS only, with certificates from a throwaway CA; clients
// must present a certificate signed by it (see [Server.ClientOptions]).
func WithTLS() Option { return func(c *config) { c.tls = true } }

// WithAOF turns on the append-only file with appendfsync always, so every
// acknowledged write survives a crash of the server process.
func WithAOF() Option { return func(c *config) { c.aof = true } }

// WithCluster runs the server as a one-node Redis Cluster owning every slot.
// Cluster mode refuses a script whose keys hash to different slots
// (CROSSSLOT) even on one node, so this proves a driver's hash tags; use
// [Server.NewUniversalClient] or a harness to get a ClusterClient.
func WithCluster() Option { return func(c *config) { c.cluster = true } }

// Server is a spawned redis-server.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	args []string
	tls  *tlsFiles
	// cluster: the server is a one-node cluster.
	cluster bool

	mu   sync.Mutex
	proc *process
}

type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // exit status, valid after done
	out  *logTail
}

// Binary returns the redis-server binary, failing t under CI=true when it is
// missing and skipping t otherwise.
func Binary(t testing.TB) string {
	t.Helper()
	name := os.Getenv("REDIS_SERVER")
	if name == "" {
		name = "redis-server"
	}
	bin, err := exec.LookPath(name)
	if err == nil {
		return bin
	}
	msg := fmt.Sprintf("redis-server not found (%v): install Debian's redis-server package (apt-get install redis-server) or set REDIS_SERVER", err)
	needs.Missing(t, msg)
	return ""
}

// Start spawns a server and stops it when t ends.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	var c config
	for _, o := range opts {
		o(&c)
	}
	s := &Server{t: t, bin: Binary(t), dir: t.TempDir(), cluster: c.cluster}
	if c.tls {
		files, err := writeTLSFiles(s.dir)
		if err != nil {
			t.Fatalf("redisservers: TLS material: %v", err)
		}
		s.tls = files
	}
	t.Cleanup(s.Kill)
	// Another process may take the free port between our probe and the
	// server's bind; try a few ports.
	var err error
	for range 5 {
		s.port = freePort(t)
		s.args = s.buildArgs(c)
		if err = s.spawn(); err == nil {
			return s
		}
		if !strings.Contains(err.Error(), "Address already in use") {
			break
		}
	}
	t.Fatalf("redisservers: start redis-server: %v", err)
	return nil
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redisservers: find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (s *Server) buildArgs(c config) []string {
	port := strconv.Itoa(s.port)
	args := []string{
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--save", "",
		"--logfile", "",
		"--daemonize", "no",
		"--loglevel", "notice",
	}
	if s.tls != nil {
		args = append(args, "--port", "0", "--tls-port", port,
			"--tls-cert-file", s.tls.serverCert, "--tls-key-file", s.tls.serverKey,
			"--tls-ca-cert-file", s.tls.caCert, "--tls-auth-clients", "yes")
	} else {
		args = append(args, "--port", port)
	}
	if c.aof {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	if c.cluster {
		args = append(args, "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(s.dir, "nodes.conf"))
	}
	for _, u := range c.users {
		args = append(args, "--user", u.name, "on", ">"+u.password)
		args = append(args, u.rules...)
	}
	return append(args, c.args...)
}

// spawn starts the process and waits until it accepts connections.
func (s *Server) spawn() error {
	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.dir
	out := &logTail{ready: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = out, out
	// Own process group, so Kill reaches any child (an AOF rewrite); die
	// with the test binary even if it never runs its cleanups.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	p := &process{cmd: cmd, done: make(chan struct{}), out: out}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	timer := time.NewTimer(readyWait)
	defer timer.Stop()
	select {
	case <-out.ready:
	case <-p.done:
		return fmt.Errorf("redis-server exited before it was ready (%v):\n%s", p.err, out.String())
	case <-timer.C:
		killGroup(p)
		return fmt.Errorf("redis-server not ready within %v:\n%s", readyWait, out.String())
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	c := goredis.NewClient(s.ClientOptions())
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), readyWait)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis-server does not answer PING: %w\n%s", err, out.String())
	}
	if s.cluster {
		return clusterReady(ctx, c)
	}
	return nil
}

// clusterReady gives a fresh one-node cluster every slot and waits until it
// reports cluster_state:ok. The server raises no event for that, so this
// polls CLUSTER INFO.
func clusterReady(ctx context.Context, c *goredis.Client) error {
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		return fmt.Errorf("CLUSTER INFO: %w", err)
	}
	if strings.Contains(info, "cluster_slots_assigned:0\r") {
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
			return fmt.Errorf("CLUSTER ADDSLOTSRANGE: %w", err)
		}
	}
	for !strings.Contains(info, "cluster_state:ok") {
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster not ok within %v:\n%s", readyWait, info)
		case <-time.After(10 * time.Millisecond):
		}
		if info, err = c.ClusterInfo(ctx).Result(); err != nil {
			return fmt.Errorf("CLUSTER INFO: %w", err)
		}
	}
	return nil
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Dir is the server's working directory (AOF, certificates).
func (s *Server) Dir() string { return s.dir }

// Log returns the tail of the server's output.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return ""
	}
	return s.proc.out.String()
}

// ClientOptions returns options for a go-redis client of the default user:
// the address, TLS when the server serves it, and ContextTimeoutEnabled so
// that context deadlines bound socket I/O.
func (s *Server) ClientOptions() *goredis.Options {
	o := &goredis.Options{
		Addr:                  s.Addr(),
		ContextTimeoutEnabled: true,
	}
	if s.tls != nil {
		o.TLSConfig = s.tls.clientConfig.Clone()
	}
	return o
}

// TLSConfig is the client TLS configuration (nil without TLS).
func (s *Server) TLSConfig() *tls.Config {
	if s.tls == nil {
		return nil
	}
	return s.tls.clientConfig.Clone()
}

// Client returns a client built from [Server.ClientOptions], changed by
// edits, and closes it when t ends.
func (s *Server) Client(t testing.TB, edits ...func(*goredis.Options)) *goredis.Client {
	t.Helper()
	o := s.ClientOptions()
	for _, e := range edits {
		e(o)
	}
	c := goredis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// NewUniversalClient returns a client built from [Server.ClientOptions]
// changed by edits: a ClusterClient when the server is a cluster, else a
// Client. The caller closes it.
func (s *Server) NewUniversalClient(edits ...func(*goredis.Options)) goredis.UniversalClient {
	o := s.ClientOptions()
	for _, e := range edits {
		e(o)
	}
	if !s.cluster {
		return goredis.NewClient(o)
	}
	return goredis.NewClusterClient(&goredis.ClusterOptions{
		Addrs:                 []string{o.Addr},
		Username:              o.Username,
		Password:              o.Password,
		TLSConfig:             o.TLSConfig,
		MaxRetries:            o.MaxRetries,
		ContextTimeoutEnabled: o.ContextTimeoutEnabled,
	})
}

// Kill sends SIGKILL to the server's process group and waits for it to
// exit: a crash. It is a no-op when the server is not running.
func (s *Server) Kill() {
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p != nil {
		killGroup(p)
	}
}

// Stop shuts the server down cleanly (SIGTERM) and waits for it to exit,
// killing it if it takes longer than readyWait.
func (s *Server) Stop() {
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	timer := time.NewTimer(readyWait)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		killGroup(p)
	}
}

// StartAgain starts a stopped or killed server on the same directory, port
// and arguments, and waits until it accepts connections.
func (s *Server) StartAgain() {
	s.t.Helper()
	if err := s.spawn(); err != nil {
		s.t.Fatalf("redisservers: restart redis-server: %v", err)
	}
}

// Restart stops the server cleanly and starts it again.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.StartAgain()
}

func killGroup(p *process) {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// logTail keeps the last lines of the server's output and signals when the
// server reports it is ready.
type logTail struct {
	mu        sync.Mutex
	buf       bytes.Buffer
	lines     []string
	ready     chan struct{}
	readyOnce sync.Once
}

const keepLines = 60

func (l *logTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	for {
		line, err := l.buf.ReadString('\n')
		if err != nil {
			l.buf.Reset()
			l.buf.WriteString(line) // keep the partial line
			break
		}
		l.lines = append(l.lines, strings.TrimRight(line, "\n"))
		if len(l.lines) > keepLines {
			l.lines = l.lines[len(l.lines)-keepLines:]
		}
		if strings.Contains(line, "Ready to accept connections") {
			l.readyOnce.Do(func() { close(l.ready) })
		}
	}
	return len(p), nil
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}
