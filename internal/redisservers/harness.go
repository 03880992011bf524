package redisservers

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

	goredis "github.com/redis/go-redis/v9"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/stores/redis"
)

// HarnessOption tunes the stores a harness opens.
type HarnessOption func(*harnessConfig)

type harnessConfig struct {
	store  []func(*redis.Options)
	client []func(*goredis.Options)
}

// WithStoreOptions edits the options of every store the harness opens (Job
// and TTL are set before the edit runs).
func WithStoreOptions(edit func(*redis.Options)) HarnessOption {
	return func(c *harnessConfig) { c.store = append(c.store, edit) }
}

// WithClientOptions edits the options of every client the harness makes,
// e.g. to log in as an ACL user.
func WithClientOptions(edit func(*goredis.Options)) HarnessOption {
	return func(c *harnessConfig) { c.client = append(c.client, edit) }
}

// Harness is a [conformance.Harness] over one fresh job on a server. Each
// store it opens has its own go-redis client, as separate processes would;
// Close closes every store and client it opened.
type Harness struct {
	srv *Server
	job string
	ttl time.Duration
	cfg harnessConfig

	mu      sync.Mutex
	stores  []*redis.Store
	clients []goredis.UniversalClient
}

var _ conformance.Harness = (*Harness)(nil)

var (
	jobSeq    atomic.Int64
	runSuffix = func() string {
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		return hex.EncodeToString(b)
	}()
)

// NewJob returns a job name no other harness or test of this process uses.
func NewJob() string {
	return fmt.Sprintf("t%d-%s", jobSeq.Add(1), runSuffix)
}

// NewHarness starts a server for t and returns a harness over a fresh job
// on it with the given TTL.
func NewHarness(t *testing.T, ttl time.Duration) conformance.Harness {
	return Start(t).NewHarness(t, ttl)
}

// NewHarness returns a harness over a fresh job on s. It is closed when t
// ends, if the caller has not closed it.
func (s *Server) NewHarness(t testing.TB, ttl time.Duration, opts ...HarnessOption) *Harness {
	h := &Harness{srv: s, job: NewJob(), ttl: ttl}
	for _, o := range opts {
		o(&h.cfg)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// HarnessMaker returns a [conformance.HarnessMaker] making a fresh job on s
// for each subtest.
func (s *Server) HarnessMaker(ttl time.Duration, opts ...HarnessOption) conformance.HarnessMaker {
	return func(t testing.TB) conformance.Harness { return s.NewHarness(t, ttl, opts...) }
}

// Job is the harness's job name.
func (h *Harness) Job() string { return h.job }

// Server is the harness's server.
func (h *Harness) Server() *Server { return h.srv }

// Options returns the store options the harness uses.
func (h *Harness) Options() redis.Options {
	o := redis.Options{Job: h.job, TTL: h.ttl}
	for _, e := range h.cfg.store {
		e(&o)
	}
	return o
}

// NewClient returns a new client with the harness's client options (a
// ClusterClient on a cluster server); the harness closes it.
func (h *Harness) NewClient() goredis.UniversalClient {
	c := h.srv.NewUniversalClient(h.cfg.client...)
	h.mu.Lock()
	h.clients = append(h.clients, c)
	h.mu.Unlock()
	return c
}

// Open opens a store over the harness's job on a new client.
func (h *Harness) Open(ctx context.Context) (*redis.Store, error) {
	st, err := redis.New(ctx, h.NewClient(), h.Options())
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.stores = append(h.stores, st)
	h.mu.Unlock()
	return st, nil
}

// NewStore implements [conformance.Harness].
func (h *Harness) NewStore(ctx context.Context) (spate.Store, error) {
	st, err := h.Open(ctx)
	if err != nil {
		return nil, err
	}
	return st, nil
}

// Close closes every store, then every client, the harness opened.
// Idempotent.
func (h *Harness) Close() error {
	h.mu.Lock()
	stores, clients := h.stores, h.clients
	h.stores, h.clients = nil, nil
	h.mu.Unlock()
	var errs []error
	for _, st := range stores {
		errs = append(errs, st.Close())
	}
	for _, c := range clients {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
