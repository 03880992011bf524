// Package etcdservers runs real etcd servers inside the test process for the
// etcd driver's tests and for any suite that needs an etcd cluster
// (go.etcd.io/etcd/server/v3/embed; no external binary, so nothing skips in
// CI).
//
// [Start] starts a cluster of one or more members on free loopback ports
// with a temporary data directory (members start through internal/embedetcd,
// which spate's default store uses too), fast raft timing, optional TLS (a
// throwaway CA, server and client certificates made in Go) and optional
// authentication (a root user and a job user with a password). It is shut
// down by t.Cleanup. [Cluster.Kill] and [Cluster.Restart] stop and start a
// member mid-test; [Cluster.WaitLeader] finds the raft leader.
//
// [Cluster.NewHarness] gives the conformance suite stores over one fresh
// prefix of a cluster. [Shared] is one single-member cluster shared by every
// test of a package; such a package calls [Main] from TestMain so the server
// stops before the goroutine leak check.
//
// This is the full-control package for spate's own tests (clusters, member
// kills, TLS, auth). Its small exported face, for users' tests, is
// stores/etcd/etcdtest.
//
// Server logs are discarded unless the test runs with -v (warnings then go
// to stderr) or SPATE_ETCD_LOG names a zap level (debug, info, warn, error).
package etcdservers

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/crypto/bcrypt"

	"github.com/spate-go/spate/internal/embedetcd"
	"github.com/spate-go/spate/internal/freeport"
	"github.com/spate-go/spate/internal/testcerts"
)

// Credentials of the users an auth-enabled cluster has.
const (
	RootUser    = "root"
	RootPass    = "root-secret"
	JobUser     = "spate"
	JobPass     = "spate-secret"
	JobRole     = "spate"
	JobKeyRange = "/" // the job role may read and write every key starting with "/"
)

// Default raft timing: a 50 ms heartbeat and a 500 ms election timeout, ten
// times faster than etcd's defaults. The server's minimum lease TTL is
// 1.5 election timeouts rounded up to whole seconds: 1 s here (2 s with the
// production defaults).
const (
	DefaultTickMs     = 50
	DefaultElectionMs = 500
)

// Options configure [Start].
type Options struct {
	// Members is the cluster size; 0 means 1.
	Members int
	// TLS serves clients over https with client certificate authentication,
	// both signed by a throwaway CA ([Cluster.CA]).
	TLS bool
	// Auth enables authentication with users [RootUser] and [JobUser].
	Auth bool
	// TickMs and ElectionMs set raft timing; 0 means the defaults above.
	TickMs, ElectionMs uint
	// Dir holds the members' data; "" means a fresh temporary directory.
	Dir string
	// MaxTxnOps is the members' --max-txn-ops; 0 means etcd's default (128).
	MaxTxnOps uint
}

// Cluster is a running embedded etcd cluster.
type Cluster struct {
	opts    Options
	dir     string
	members []*Member
	lg      *zap.Logger

	// CA signed the server and client certificates when Options.TLS is set.
	CA *testcerts.CA
	// ServerCert is every member's serving certificate; ClientCert is a
	// client certificate the members trust.
	ServerCert, ClientCert testcerts.Pair

	mu sync.Mutex // serialises Kill/Restart
}

// Member is one etcd server of a cluster.
type Member struct {
	Name      string
	Dir       string
	ClientURL url.URL
	PeerURL   url.URL
	etcd      *embed.Etcd // nil while stopped
}

// Etcd is the running server, or nil while the member is stopped.
func (m *Member) Etcd() *embed.Etcd { return m.etcd }

// Start starts a cluster and stops it when t ends. It fails t if the
// cluster does not come up.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	c, err := start(opts)
	if err != nil {
		t.Fatalf("etcdservers: start cluster: %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}

func start(opts Options) (*Cluster, error) {
	if opts.Members <= 0 {
		opts.Members = 1
	}
	if opts.TickMs == 0 {
		opts.TickMs = DefaultTickMs
	}
	if opts.ElectionMs == 0 {
		opts.ElectionMs = DefaultElectionMs
	}
	c := &Cluster{opts: opts, dir: opts.Dir, lg: serverLogger()}
	if opts.TLS {
		var err error
		if c.CA, err = testcerts.New(c.dir, "spate-test"); err != nil {
			return nil, err
		}
		if c.ServerCert, err = c.CA.Server("etcd-server"); err != nil {
			return nil, err
		}
		if c.ClientCert, err = c.CA.Client(JobUser); err != nil {
			return nil, err
		}
	}
	// Free ports are found by binding port 0 and releasing it, so another
	// process may take one before etcd binds it; try a few times.
	var err error
	for range 3 {
		if err = c.startMembers(); err == nil {
			break
		}
		c.Stop()
	}
	if err != nil {
		return nil, err
	}
	if opts.Auth {
		if err := c.enableAuth(); err != nil {
			c.Stop()
			return nil, fmt.Errorf("enable auth: %w", err)
		}
	}
	return c, nil
}

func (c *Cluster) startMembers() error {
	c.members = make([]*Member, c.opts.Members)
	var initial []string
	scheme := "http"
	if c.opts.TLS {
		scheme = "https"
	}
	for i := range c.members {
		ports, err := freeport.Ports(2)
		if err != nil {
			return err
		}
		m := &Member{
			Name:      "m" + strconv.Itoa(i),
			Dir:       filepath.Join(c.dir, fmt.Sprintf("m%d-%d", i, ports[0])),
			ClientURL: url.URL{Scheme: scheme, Host: "127.0.0.1:" + strconv.Itoa(ports[0])},
			PeerURL:   url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(ports[1])},
		}
		c.members[i] = m
		initial = append(initial, m.Name+"="+m.PeerURL.String())
	}
	cluster := strings.Join(initial, ",")
	errs := make(chan error, len(c.members))
	for _, m := range c.members {
		go func() { errs <- c.startMember(m, cluster) }()
	}
	var all []error
	for range c.members {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

// startMember starts (or restarts, with its data) one member and waits until
// it serves clients.
func (c *Cluster) startMember(m *Member, initialCluster string) error {
	spec := embedetcd.Member{
		Name:           m.Name,
		Dir:            m.Dir,
		ClientURL:      m.ClientURL,
		PeerURL:        m.PeerURL,
		InitialCluster: initialCluster,
		ClusterToken:   "spate-test-" + filepath.Base(c.dir),
		TickMs:         c.opts.TickMs,
		ElectionMs:     c.opts.ElectionMs,
		Logger:         c.lg,
		BcryptCost:     uint(bcrypt.MinCost),
		MaxTxnOps:      c.opts.MaxTxnOps,
	}
	if c.opts.TLS {
		spec.TLS = &embedetcd.TLS{
			CertFile:       c.ServerCert.CertFile,
			KeyFile:        c.ServerCert.KeyFile,
			TrustedCAFile:  c.CA.CertFile,
			ClientCertAuth: true,
		}
	}
	e, err := embedetcd.Start(spec)
	if err != nil {
		return err
	}
	m.etcd = e
	return nil
}

// Stop stops every member. It is idempotent; Start's cleanup calls it.
func (c *Cluster) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	var wg sync.WaitGroup
	for _, m := range c.members {
		if m != nil && m.etcd != nil {
			e := m.etcd
			m.etcd = nil
			wg.Go(e.Close)
		}
	}
	wg.Wait()
}

// Members returns the members, running or not.
func (c *Cluster) Members() []*Member { return c.members }

// Endpoints are the client URLs of every member, running or not.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.ClientURL.String()
	}
	return eps
}

// TLSConfig is a client TLS configuration that trusts the cluster's CA and
// presents a client certificate it accepts; nil without TLS.
func (c *Cluster) TLSConfig() *tls.Config {
	if c.CA == nil {
		return nil
	}
	return &tls.Config{RootCAs: c.CA.Pool(), Certificates: []tls.Certificate{c.ClientCert.TLS}, MinVersion: tls.VersionTLS12}
}

// ClientConfig is a client configuration for every member: the cluster's TLS
// material and, with auth, the job user's credentials. The dial timeout is
// 5 s and client logs follow the server's verbosity.
func (c *Cluster) ClientConfig() clientv3.Config {
	cfg := clientv3.Config{
		Endpoints:   c.Endpoints(),
		DialTimeout: 5 * time.Second,
		TLS:         c.TLSConfig(),
		Logger:      c.lg.Named("client"),
	}
	if c.opts.Auth {
		cfg.Username, cfg.Password = JobUser, JobPass
	}
	return cfg
}

// Client opens a client with [Cluster.ClientConfig], adjusted by edit when
// not nil, and closes it when t ends.
func (c *Cluster) Client(t testing.TB, edit func(*clientv3.Config)) *clientv3.Client {
	t.Helper()
	cfg := c.ClientConfig()
	if edit != nil {
		edit(&cfg)
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatalf("etcdservers: client for %v: %v", cfg.Endpoints, err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// RootClient opens a client as the root user (or without credentials when
// auth is off); the caller closes it.
func (c *Cluster) RootClient() (*clientv3.Client, error) {
	cfg := c.ClientConfig()
	if c.opts.Auth {
		cfg.Username, cfg.Password = RootUser, RootPass
	}
	return clientv3.New(cfg)
}

func (c *Cluster) enableAuth() error {
	cfg := c.ClientConfig()
	cfg.Username, cfg.Password = "", ""
	cli, err := clientv3.New(cfg)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	steps := []func() error{
		func() error { _, err := cli.RoleAdd(ctx, "root"); return err },
		func() error { _, err := cli.UserAdd(ctx, RootUser, RootPass); return err },
		func() error { _, err := cli.UserGrantRole(ctx, RootUser, "root"); return err },
		func() error { _, err := cli.RoleAdd(ctx, JobRole); return err },
		func() error {
			_, err := cli.RoleGrantPermission(ctx, JobRole, JobKeyRange, clientv3.GetPrefixRangeEnd(JobKeyRange),
				clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := cli.UserAdd(ctx, JobUser, JobPass); return err },
		func() error { _, err := cli.UserGrantRole(ctx, JobUser, JobRole); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// Kill stops member i abruptly: raft stops without handing leadership over,
// in-flight requests fail, and the member's listeners close. Its data stays
// for [Cluster.Restart].
func (c *Cluster) Kill(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.members[i]
	if m.etcd == nil {
		return
	}
	e := m.etcd
	m.etcd = nil
	e.Server.HardStop()
	e.Close()
}

// Restart starts a killed member again with its data.
func (c *Cluster) Restart(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.members[i]
	if m.etcd != nil {
		return nil
	}
	var initial []string
	for _, o := range c.members {
		initial = append(initial, o.Name+"="+o.PeerURL.String())
	}
	return c.startMember(m, strings.Join(initial, ","))
}

// Leader returns the index of the member every running member currently
// follows, or -1 if they do not agree on a running leader.
func (c *Cluster) Leader() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	lead, agreed := uint64(0), true
	for _, m := range c.members {
		if m.etcd == nil {
			continue
		}
		l := m.etcd.Server.Lead()
		if lead == 0 {
			lead = l
		}
		agreed = agreed && l == lead && l != 0
	}
	if !agreed {
		return -1
	}
	for i, m := range c.members {
		if m.etcd != nil && uint64(m.etcd.Server.MemberID()) == lead {
			return i
		}
	}
	return -1
}

// WaitLeader waits up to timeout until the running members agree on a
// running leader and returns its index. It polls the members' raft state
// every 10 ms: the view it waits for is an agreement across members, which
// no single member's notification announces.
func (c *Cluster) WaitLeader(timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if l := c.Leader(); l >= 0 {
			return l, nil
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("etcdservers: no agreed leader after %v", timeout)
		}
		<-tick.C
	}
}

// serverLogger is quiet unless the run is verbose or SPATE_ETCD_LOG asks.
func serverLogger() *zap.Logger {
	level := os.Getenv("SPATE_ETCD_LOG")
	if level == "" {
		if !testing.Testing() || !testing.Verbose() {
			return zap.NewNop()
		}
		level = "warn"
	}
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		lvl = zapcore.WarnLevel
	}
	cfg := zap.NewDevelopmentConfig()
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.OutputPaths = []string{"stderr"}
	cfg.DisableStacktrace = true
	lg, err := cfg.Build()
	if err != nil {
		return zap.NewNop()
	}
	return lg
}
