package natsservers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	spatenats "github.com/spate-go/spate/stores/nats"
)

// Harness is a [conformance.Harness] over one job's buckets: every NewStore
// opens a new connection and a new store on the same Job, as separate
// processes would. Close closes every store still open and every
// connection the harness opened.
type Harness struct {
	connect func() (*natsgo.Conn, error)
	opts    spatenats.Options
	owned   func() // shuts down a server the harness started, or nil

	mu     sync.Mutex
	conns  []*natsgo.Conn
	stores []*spatenats.Store
	closed bool
}

var _ conformance.Harness = (*Harness)(nil)

// NewHarness starts a server of its own (shut down by Close or at cleanup)
// and returns a harness on a fresh Job with lease TTL ttl.
func NewHarness(t testing.TB, ttl time.Duration) *Harness {
	t.Helper()
	s := Start(t)
	h := s.Harness(t, spatenats.Options{TTL: ttl})
	h.owned = s.Shutdown
	return h
}

// Harness returns a harness over this server on a fresh Job; opts.Job, when
// empty, is generated.
func (s *Server) Harness(t testing.TB, opts spatenats.Options) *Harness {
	t.Helper()
	if opts.Job == "" {
		opts.Job = NewJob()
	}
	h := &Harness{opts: opts, connect: func() (*natsgo.Conn, error) {
		return natsgo.Connect(s.URL, s.clientOptions(nil)...)
	}}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// Harness returns a harness over the cluster (connections know every node)
// on a fresh Job.
func (c *Cluster) Harness(t testing.TB, opts spatenats.Options) *Harness {
	t.Helper()
	if opts.Job == "" {
		opts.Job = NewJob()
	}
	h := &Harness{opts: opts, connect: func() (*natsgo.Conn, error) {
		return natsgo.Connect(c.URLs(), c.Nodes[0].clientOptions(nil)...)
	}}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

var jobs atomic.Int64

// NewJob returns a job name no other harness of this process uses.
func NewJob() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("t%d_%s", jobs.Add(1), hex.EncodeToString(b[:]))
}

// Options are the store options of the harness (Job included).
func (h *Harness) Options() spatenats.Options { return h.opts }

// NewStore implements [conformance.Harness].
func (h *Harness) NewStore(ctx context.Context) (spate.Store, error) {
	return h.NewNATSStore(ctx)
}

// NewNATSStore is NewStore with the concrete type.
func (h *Harness) NewNATSStore(ctx context.Context) (*spatenats.Store, error) {
	nc, err := h.Conn()
	if err != nil {
		return nil, err
	}
	st, err := spatenats.New(ctx, nc, h.opts)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		_ = st.Close()
		return nil, errors.New("natsservers: harness closed")
	}
	h.stores = append(h.stores, st)
	return st, nil
}

// Conn opens a connection that Close closes.
func (h *Harness) Conn() (*natsgo.Conn, error) {
	nc, err := h.connect()
	if err != nil {
		return nil, spatenats.ClassifyConnectError(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		nc.Close()
		return nil, errors.New("natsservers: harness closed")
	}
	h.conns = append(h.conns, nc)
	return nc, nil
}

// Close closes the harness's stores, then its connections, and stops the
// server it started. Idempotent.
func (h *Harness) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	conns, stores := h.conns, h.stores
	h.conns, h.stores = nil, nil
	h.mu.Unlock()
	for _, st := range stores {
		_ = st.Close()
	}
	for _, nc := range conns {
		nc.Close()
	}
	if h.owned != nil {
		h.owned()
	}
	return nil
}
