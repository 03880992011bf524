// Package embedetcd runs etcd inside the process
// (go.etcd.io/etcd/server/v3/embed). It holds what spate's default store and
// the test servers of internal/etcdservers share:
//
//   - [Start] starts one member from a [Member] description (data directory,
//     URLs, raft timing, TLS, logger) and waits until it serves clients;
//   - [StartOrJoin] is the start-or-join logic of `spate`'s default store: a
//     single-member etcd with a short election timeout on a fixed loopback
//     port and a local data directory, so that several `spate` processes on
//     one machine share one store. The first process starts (and hosts) it;
//     the others find it on the port and connect to it.
//
// # Durability
//
// A single member acknowledges a write once it is in its fsynced raft log:
// it survives a crash of the hosting process (the data directory is read
// back on the next start), not the loss of the disk. It has no fault
// tolerance beyond that; for a fleet that must survive a machine, run a
// three-member etcd cluster and point spate at it.
package embedetcd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Production raft timing: etcd's own defaults. With them the server's
// minimum lease TTL (1.5 election timeouts rounded up to whole seconds) is
// 2 s.
const (
	ProductionTickMs     = 100
	ProductionElectionMs = 1000
)

// Raft timing of the default store's lone member ([StartOrJoin]). A
// single member elects itself: etcd fast-forwards all but one of its
// election ticks at start, but raft draws the election timeout at random
// between one and two timeouts, so the member still waits up to one
// election timeout (0.5 s on average at production timing, most of a
// one-worker job's time to its first split) before it campaigns, and it
// serves clients only once it leads. With no peers, the timeout guards
// nothing else: a leader without peers never loses its leadership. The
// shorter timing costs 20 ticks a second instead of 10 and lowers the
// server's minimum lease TTL to 1 s; spate keeps the default store's lease
// floor at the production value's 2 s (cmd/spate), so leases are
// unchanged. A multi-member cluster keeps production timing.
const (
	LocalTickMs     = 50
	LocalElectionMs = 250
)

// DefaultReadyTimeout bounds how long [Start] waits for a member to serve.
const DefaultReadyTimeout = 30 * time.Second

// TLS is a member's client-facing TLS material (files: etcd reads them from
// disk).
type TLS struct {
	CertFile, KeyFile string
	// TrustedCAFile verifies client certificates when ClientCertAuth is set.
	TrustedCAFile  string
	ClientCertAuth bool
}

// Member describes one etcd server. Zero fields take the defaults named on
// them.
type Member struct {
	// Name is the member name. Default "spate".
	Name string
	// Dir is the data directory (created 0700 if missing). Required.
	Dir string
	// ClientURL and PeerURL are where the member listens for clients and
	// peers, and what it advertises. Required.
	ClientURL, PeerURL url.URL
	// InitialCluster lists every member as name=peerURL,...; default: this
	// member alone. Ignored when Dir already holds a member's data.
	InitialCluster string
	// ClusterToken tells clusters apart at bootstrap. Default "spate".
	ClusterToken string
	// TickMs and ElectionMs set raft timing. Default: production timing.
	TickMs, ElectionMs uint
	// TLS serves clients over TLS; nil serves plain http.
	TLS *TLS
	// Logger receives the server's logs; nil discards them.
	Logger *zap.Logger
	// MaxTxnOps is the server's --max-txn-ops; 0 is etcd's default (128).
	MaxTxnOps uint
	// BcryptCost hashes passwords of auth users; 0 is etcd's default.
	// Tests lower it to bcrypt.MinCost.
	BcryptCost uint
	// AutoCompactionRetention turns on periodic compaction of the key
	// history ("1h": keep an hour); "" leaves compaction off.
	AutoCompactionRetention string
	// ReadyTimeout bounds the wait for the member to serve. Default
	// [DefaultReadyTimeout].
	ReadyTimeout time.Duration
}

// Start starts the member and waits until it serves clients. The caller
// closes the returned server (Close stops it gracefully; Server.HardStop
// first makes it a crash).
func Start(m Member) (*embed.Etcd, error) {
	if m.Dir == "" {
		return nil, errors.New("embedetcd: Member.Dir is required")
	}
	if m.Name == "" {
		m.Name = "spate"
	}
	if m.ClusterToken == "" {
		m.ClusterToken = "spate"
	}
	if m.TickMs == 0 {
		m.TickMs = ProductionTickMs
	}
	if m.ElectionMs == 0 {
		m.ElectionMs = ProductionElectionMs
	}
	if m.InitialCluster == "" {
		m.InitialCluster = m.Name + "=" + m.PeerURL.String()
	}
	if m.ReadyTimeout <= 0 {
		m.ReadyTimeout = DefaultReadyTimeout
	}
	lg := m.Logger
	if lg == nil {
		lg = zap.NewNop()
	}
	cfg := embed.NewConfig()
	cfg.Name = m.Name
	cfg.Dir = m.Dir
	cfg.TickMs = m.TickMs
	cfg.ElectionMs = m.ElectionMs
	cfg.ListenClientUrls = []url.URL{m.ClientURL}
	cfg.AdvertiseClientUrls = []url.URL{m.ClientURL}
	cfg.ListenPeerUrls = []url.URL{m.PeerURL}
	cfg.AdvertisePeerUrls = []url.URL{m.PeerURL}
	cfg.InitialCluster = m.InitialCluster
	cfg.InitialClusterToken = m.ClusterToken
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg.Named(m.Name))
	cfg.Metrics = "basic"
	if m.MaxTxnOps > 0 {
		cfg.MaxTxnOps = m.MaxTxnOps
	}
	if m.BcryptCost != 0 {
		cfg.BcryptCost = m.BcryptCost
	}
	if m.AutoCompactionRetention != "" {
		cfg.AutoCompactionMode = embed.CompactorModePeriodic
		cfg.AutoCompactionRetention = m.AutoCompactionRetention
	}
	if m.TLS != nil {
		cfg.ClientTLSInfo.CertFile = m.TLS.CertFile
		cfg.ClientTLSInfo.KeyFile = m.TLS.KeyFile
		cfg.ClientTLSInfo.TrustedCAFile = m.TLS.TrustedCAFile
		cfg.ClientTLSInfo.ClientCertAuth = m.TLS.ClientCertAuth
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("member %s: %w", m.Name, err)
	}
	timer := time.NewTimer(m.ReadyTimeout)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("member %s failed while starting: %w", m.Name, err)
	case <-timer.C:
		e.Server.HardStop()
		e.Close()
		return nil, fmt.Errorf("member %s not ready after %v", m.Name, m.ReadyTimeout)
	}
}

// ErrNotEtcd is returned by [Probe] when something listens on the address
// but does not answer as an etcd server.
var ErrNotEtcd = errors.New("embedetcd: the address is in use by something that is not an etcd server")

// Probe reports whether an etcd server answers (plain http) at addr
// (host:port). Nothing listening is (false, nil); a listener that does not
// answer as etcd within the context's deadline is an error matching
// [ErrNotEtcd].
func Probe(ctx context.Context, addr string) (bool, error) {
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	conn, err := d.DialContext(dctx, "tcp", addr)
	cancel()
	if err != nil {
		return false, nil
	}
	_ = conn.Close()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{"http://" + addr},
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return false, fmt.Errorf("%w (%s: %v)", ErrNotEtcd, addr, err)
	}
	defer cli.Close()
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := cli.Status(sctx, "http://"+addr); err != nil {
		return false, fmt.Errorf("%w (%s: %v)", ErrNotEtcd, addr, err)
	}
	return true, nil
}
