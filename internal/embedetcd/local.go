package embedetcd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// DefaultClientAddr is where spate's default store serves clients.
const DefaultClientAddr = "127.0.0.1:23790"

// LocalOptions configure [StartOrJoin].
type LocalOptions struct {
	// DataDir holds the member's data. Its lock file is DataDir+".lock".
	// Required.
	DataDir string
	// ClientAddr is the loopback host:port clients use. Default
	// [DefaultClientAddr].
	ClientAddr string
	// PeerAddr is the raft peer listener; default the client port + 10 on
	// the same host.
	PeerAddr string
	// Logger receives the hosted server's logs; nil discards them, unless
	// LogFile is set.
	Logger *zap.Logger
	// LogFile, when Logger is nil, receives the hosted server's warnings
	// and errors. It is created (with its directory) only by a process that
	// starts the server.
	LogFile string
	// JoinTimeout bounds the wait for another process that is starting the
	// server. Default 30s.
	JoinTimeout time.Duration
	// NoStart only joins: if nothing serves ClientAddr it fails with
	// [ErrNotRunning] instead of starting a server.
	NoStart bool
}

// ErrNotRunning is returned by [StartOrJoin] with NoStart when no server
// answers.
var ErrNotRunning = errors.New("embedetcd: no etcd server is running there")

// Local is spate's default store: a single-member etcd this process hosts,
// or one another process hosts on the same address.
type Local struct {
	// Endpoint is the client URL ("http://127.0.0.1:23790").
	Endpoint string
	// DataDir is the hosted member's data directory ("" when joined).
	DataDir string
	etcd    *embed.Etcd
	lock    *os.File

	mu  sync.Mutex
	cli *clientv3.Client // for the store's own records (record.go)
}

// Hosted reports whether this process runs the server (and stops it on
// Close).
func (l *Local) Hosted() bool { return l.etcd != nil }

// Close stops a hosted server and releases its data directory; for a
// joined server it does nothing. Idempotent.
func (l *Local) Close() {
	l.mu.Lock()
	if l.cli != nil {
		_ = l.cli.Close()
		l.cli = nil
	}
	l.mu.Unlock()
	if l.etcd != nil {
		l.etcd.Close()
		l.etcd = nil
	}
	if l.lock != nil {
		_ = unlockFile(l.lock)
		_ = l.lock.Close()
		l.lock = nil
	}
}

// StartOrJoin returns the etcd server at opts.ClientAddr, starting one on
// opts.DataDir if none answers there:
//
//  1. an etcd answering at ClientAddr is joined;
//  2. otherwise the data directory's lock file is taken (flock); a process
//     holding it is starting or hosting a server, so this one waits for it
//     to answer and joins;
//  3. holding the lock, it starts the member (a lone member's short raft
//     timing, [LocalElectionMs]; hourly auto-compaction) and hosts it
//     until Close.
//
// Something other than etcd listening on ClientAddr is an error matching
// [ErrNotEtcd].
func StartOrJoin(ctx context.Context, opts LocalOptions) (*Local, error) {
	if opts.ClientAddr == "" {
		opts.ClientAddr = DefaultClientAddr
	}
	if opts.JoinTimeout <= 0 {
		opts.JoinTimeout = 30 * time.Second
	}
	host, port, err := net.SplitHostPort(opts.ClientAddr)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: client address %q: %w", opts.ClientAddr, err)
	}
	if opts.PeerAddr == "" {
		p, err := strconv.Atoi(port)
		if err != nil {
			return nil, fmt.Errorf("embedetcd: client address %q: bad port", opts.ClientAddr)
		}
		opts.PeerAddr = net.JoinHostPort(host, strconv.Itoa(p+10))
	}
	joined := &Local{Endpoint: "http://" + opts.ClientAddr}
	if ok, err := Probe(ctx, opts.ClientAddr); err != nil || ok {
		if err != nil {
			return nil, err
		}
		return joined, nil
	}
	if opts.NoStart {
		return nil, fmt.Errorf("%w (%s)", ErrNotRunning, opts.ClientAddr)
	}
	if opts.DataDir == "" {
		return nil, errors.New("embedetcd: LocalOptions.DataDir is required")
	}
	if err := os.MkdirAll(filepath.Dir(opts.DataDir), 0o700); err != nil {
		return nil, fmt.Errorf("embedetcd: %w", err)
	}
	lockPath := opts.DataDir + ".lock"
	lock, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: %w", err)
	}
	got, err := tryLockFile(lock)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("embedetcd: lock %s: %w", lockPath, err)
	}
	if !got {
		lock.Close()
		return waitAndJoin(ctx, opts, lockPath, joined)
	}
	// Another process may have started a server (from another data
	// directory) between the probe and the lock.
	if ok, err := Probe(ctx, opts.ClientAddr); err != nil || ok {
		_ = unlockFile(lock)
		lock.Close()
		if err != nil {
			return nil, err
		}
		return joined, nil
	}
	_ = lock.Truncate(0)
	_, _ = lock.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	if opts.Logger == nil && opts.LogFile != "" {
		if opts.Logger, err = fileLogger(opts.LogFile); err != nil {
			_ = unlockFile(lock)
			lock.Close()
			return nil, fmt.Errorf("embedetcd: log file: %w", err)
		}
	}
	e, err := Start(Member{
		Dir:                     opts.DataDir,
		ClientURL:               url.URL{Scheme: "http", Host: opts.ClientAddr},
		PeerURL:                 url.URL{Scheme: "http", Host: opts.PeerAddr},
		TickMs:                  LocalTickMs,
		ElectionMs:              LocalElectionMs,
		Logger:                  opts.Logger,
		AutoCompactionRetention: "1h",
	})
	if err != nil {
		_ = unlockFile(lock)
		lock.Close()
		// Lost a race for the port to a server started elsewhere?
		if ok, perr := Probe(ctx, opts.ClientAddr); ok && perr == nil {
			return joined, nil
		}
		return nil, fmt.Errorf("embedetcd: start etcd on %s (data %s): %w", opts.ClientAddr, opts.DataDir, err)
	}
	return &Local{Endpoint: joined.Endpoint, DataDir: opts.DataDir, etcd: e, lock: lock}, nil
}

// waitAndJoin waits for the process holding the data directory's lock to
// serve, then joins it.
func waitAndJoin(ctx context.Context, opts LocalOptions, lockPath string, joined *Local) (*Local, error) {
	deadline := time.Now().Add(opts.JoinTimeout)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := Probe(ctx, opts.ClientAddr)
		if ok {
			return joined, nil
		}
		if time.Now().After(deadline) {
			holder := "another process"
			if b, rerr := os.ReadFile(lockPath); rerr == nil && len(strings.TrimSpace(string(b))) > 0 {
				holder = "process " + strings.TrimSpace(string(b))
			}
			if err == nil {
				err = fmt.Errorf("nothing answers at %s", opts.ClientAddr)
			}
			return nil, fmt.Errorf("embedetcd: %s holds %s but no etcd answered at %s within %v: %w",
				holder, lockPath, opts.ClientAddr, opts.JoinTimeout, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
}

// fileLogger sends warnings and errors to a file.
func fileLogger(path string) (*zap.Logger, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(zap.WarnLevel)
	cfg.OutputPaths = []string{path}
	cfg.ErrorOutputPaths = []string{path}
	cfg.Sampling = nil
	return cfg.Build()
}
