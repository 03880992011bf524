package etcdservers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/stores/etcd"
)

// Harness gives the conformance suite stores over one fresh prefix of a
// cluster. Every NewStore opens its own client (as a separate process
// would) and a store over the shared prefix; closing the store closes that
// client too. Close closes every store still open, with its client, and
// deletes the prefix.
type Harness struct {
	c      *Cluster
	prefix string
	opts   etcd.Options
	edit   func(*clientv3.Config)

	mu     sync.Mutex
	stores []*ownedStore
	closed bool
}

var _ conformance.Harness = (*Harness)(nil)

// NewHarness is a harness with TTL ttl over a fresh prefix of c; t closes it
// at cleanup.
func (c *Cluster) NewHarness(t testing.TB, ttl time.Duration) *Harness {
	t.Helper()
	h := &Harness{c: c, prefix: FreshPrefix(), opts: etcd.Options{TTL: ttl}}
	h.opts.Prefix = h.prefix
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// FreshPrefix is a new random store prefix under "/spate-test/".
func FreshPrefix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "/spate-test/" + hex.EncodeToString(b) + "/"
}

// Prefix is the harness's store prefix.
func (h *Harness) Prefix() string { return h.prefix }

// Options are the store options NewStore uses.
func (h *Harness) Options() etcd.Options { return h.opts }

// EditClient adjusts the client config of every later NewStore (for
// example, to point a store at one member).
func (h *Harness) EditClient(edit func(*clientv3.Config)) { h.edit = edit }

// NewStore implements [conformance.Harness].
func (h *Harness) NewStore(ctx context.Context) (spate.Store, error) {
	cfg := h.c.ClientConfig()
	if h.edit != nil {
		h.edit(&cfg)
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcdservers: client: %w", err)
	}
	s, err := etcd.New(ctx, cli, h.opts)
	if err != nil {
		_ = cli.Close()
		return nil, err
	}
	o := &ownedStore{Store: s, cli: cli}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		_ = o.Close()
		return nil, fmt.Errorf("etcdservers: NewStore on a closed harness: %w", spate.ErrFatal)
	}
	h.stores = append(h.stores, o)
	return o, nil
}

// Close implements [conformance.Harness]: it closes every store still open
// (and its client) and deletes the prefix. Idempotent.
func (h *Harness) Close() error {
	h.mu.Lock()
	stores, closed := h.stores, h.closed
	h.stores, h.closed = nil, true
	h.mu.Unlock()
	if closed {
		return nil
	}
	for _, s := range stores {
		_ = s.Close()
	}
	cli, err := h.c.RootClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = cli.Delete(ctx, h.prefix, clientv3.WithPrefix())
	return err
}

// ownedStore is a store that owns its client, as a process would: Close
// closes both. Idempotent.
type ownedStore struct {
	*etcd.Store
	cli *clientv3.Client
}

func (o *ownedStore) Close() error {
	err := o.Store.Close()
	_ = o.cli.Close()
	return err
}

// Unwrap returns the etcd store.
func (o *ownedStore) Unwrap() *etcd.Store { return o.Store }

var shared struct {
	mu  sync.Mutex
	c   *Cluster
	dir string
	err error
}

// Shared returns the package's single-member cluster, starting it on first
// use. It lives until [StopShared]; call [Main] from TestMain.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	c, err := SharedCluster()
	if err != nil {
		t.Fatalf("etcdservers: shared cluster: %v", err)
	}
	return c
}

// SharedCluster is [Shared] for code without a testing.TB (examples).
func SharedCluster() (*Cluster, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.c == nil && shared.err == nil {
		shared.dir, shared.err = os.MkdirTemp("", "spate-etcdservers-")
		if shared.err == nil {
			shared.c, shared.err = start(Options{Dir: shared.dir})
		}
	}
	return shared.c, shared.err
}

// StopShared stops the shared cluster, if it started, and removes its data.
func StopShared() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.c != nil {
		shared.c.Stop()
		shared.c = nil
	}
	if shared.dir != "" {
		_ = os.RemoveAll(shared.dir)
		shared.dir = ""
	}
}

// Main runs a test package that uses [Shared]: the tests, then StopShared,
// then a goroutine leak check (go.uber.org/goleak) if they passed.
//
// One etcd-internal goroutine is exempt: a peer's /version request that a
// member was serving when the test killed it can stay blocked on the dead
// member's backend lock (seen once in a full-suite run: an HTTP handler in
// etcdhttp.versionHandler waiting in backend.(*baseReadTx).UnsafeRange a
// minute after the kill). It is the embedded server's, holds no spate
// state, and ends with the process.
func Main(m *testing.M, opts ...goleak.Option) {
	code := m.Run()
	StopShared()
	if code == 0 {
		if err := goleak.Find(append(opts, LeakIgnores()...)...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines leaked after the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// LeakIgnores are the goleak options for embedded-etcd goroutines that may
// outlive a killed member (see [Main]).
func LeakIgnores() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/etcdserver/api/etcdhttp.newPeerHandler.versionHandler.func1"),
	}
}
