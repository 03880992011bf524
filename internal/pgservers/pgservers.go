// Package pgservers runs a real PostgreSQL server for a test package: one
// server per package binary (started on first use, stopped by [Main]), on a
// free loopback port, its data directory and unix socket directory in a
// fresh temporary directory, with fsync off (test data is throwaway).
//
// The binaries are Debian's (initdb and postgres under
// /usr/lib/postgresql/<version>/bin, the highest version found) or those in
// $PG_BIN. The server refuses to run as root, so when the tests run as root
// (as CI does) the harness gives the temporary directory to the postgres
// system user and runs initdb and the server as that user.
//
// When the binaries are missing a test fails if CI=true and is skipped,
// loudly, otherwise.
//
// Use it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(pgservers.Main(m)) }
//
// and in a test, [Shared] returns the server and [Server.NewDB] a fresh
// database of its own.
package pgservers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spate-go/spate/internal/needs"
)

// readyWait bounds how long a server may take to accept connections.
const readyWait = 60 * time.Second

// Server is a running postgres.
type Server struct {
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{}
	out  *bytes.Buffer
	seq  atomic.Int64
}

var (
	shared     *Server
	sharedErr  error
	sharedOnce sync.Once
	missing    string // why the binaries are unusable, "" when found
)

// Main runs the package's tests and stops the shared server afterwards.
func Main(m *testing.M) int {
	code := m.Run()
	if shared != nil {
		shared.Stop()
	}
	return code
}

// BinDir returns the directory of initdb and postgres, failing t under
// CI=true when they are missing and skipping it otherwise.
func BinDir(t testing.TB) string {
	t.Helper()
	dir, err := binDir()
	if err == nil {
		return dir
	}
	msg := fmt.Sprintf("PostgreSQL not found (%v): install Debian's postgresql package (apt-get install postgresql) or set PG_BIN to the directory holding initdb and postgres", err)
	needs.Missing(t, msg)
	return ""
}

func binDir() (string, error) {
	if d := os.Getenv("PG_BIN"); d != "" {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err != nil {
			return "", fmt.Errorf("PG_BIN=%s: %w", d, err)
		}
		return d, nil
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(found) == 0 {
		return "", errors.New("no /usr/lib/postgresql/*/bin/postgres")
	}
	sort.Slice(found, func(i, j int) bool { return version(found[i]) > version(found[j]) })
	return filepath.Dir(found[0]), nil
}

func version(postgres string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(postgres))))
	return v
}

// Shared returns the package's server, starting it on first use.
func Shared(t testing.TB) *Server {
	t.Helper()
	bin := BinDir(t)
	sharedOnce.Do(func() { shared, sharedErr = start(bin) })
	if sharedErr != nil {
		t.Fatalf("pgservers: start postgres: %v", sharedErr)
	}
	return shared
}

// credential is the postgres system user's when we run as root.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, and the server refuses root: %w (the postgresql package creates the postgres user)", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func start(bin string) (*Server, error) {
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	// Not t.TempDir: the server outlives the first test, and every parent
	// of the directory must be traversable by the postgres user.
	dir, err := os.MkdirTemp("", "pgservers-")
	if err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	s := &Server{dir: dir, done: make(chan struct{}), out: &bytes.Buffer{}}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", s.data(), "-U", "postgres",
		"--auth=trust", "--no-sync", "--encoding=UTF8", "--locale=C")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	if err := os.Mkdir(s.sockets(), 0o700); err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(s.sockets(), int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	// Another process may take the free port between the probe and the
	// server's bind; try a few.
	for range 5 {
		s.port, err = freePort()
		if err != nil {
			break
		}
		if err = s.spawn(bin, cred); err == nil {
			return s, nil
		}
		if !bytes.Contains(s.out.Bytes(), []byte("already in use")) {
			break
		}
	}
	_ = os.RemoveAll(dir)
	return nil, err
}

func (s *Server) data() string    { return filepath.Join(s.dir, "data") }
func (s *Server) sockets() string { return filepath.Join(s.dir, "sock") }

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) spawn(bin string, cred *syscall.Credential) error {
	s.out.Reset()
	s.done = make(chan struct{})
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", s.data(), "-p", strconv.Itoa(s.port),
		"-k", s.sockets(), "-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200", "-c", "shared_buffers=64MB")
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = s.out, s.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd = cmd
	go func() { _ = cmd.Wait(); close(s.done) }()
	deadline := time.Now().Add(readyWait)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := pgx.Connect(ctx, s.URL("postgres"))
		cancel()
		if err == nil {
			_ = c.Close(context.Background())
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("postgres exited: %s", s.out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Stop()
			return fmt.Errorf("postgres did not accept connections within %v: %v", readyWait, err)
		}
	}
}

// Port is the server's TCP port.
func (s *Server) Port() int { return s.port }

// URL is the connection URL of database db, as the superuser postgres.
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// NewDB creates a fresh database and returns its URL; it is dropped when t
// ends.
func (s *Server) NewDB(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d", s.seq.Add(1))
	ctx := context.Background()
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		t.Fatalf("pgservers: connect: %v", err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgservers: create database: %v", err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, s.URL("postgres"))
		if err != nil {
			return
		}
		defer c.Close(ctx)
		_, _ = c.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)")
	})
	return s.URL(name)
}

// Stop shuts the server down (fast shutdown, then a kill of its process
// group) and removes its directory.
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.done:
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-s.done
		}
	}
	_ = os.RemoveAll(s.dir)
}
