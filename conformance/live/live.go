// Package live runs the conformance suite against a deployment you already
// have, reached by its store URL: your etcd, Redis or NATS, with your
// settings, credentials and ACLs.
//
//	import (
//		_ "github.com/spate-go/spate/stores/redis" // the scheme of your URL
//	)
//
//	func TestMyDeployment(t *testing.T) {
//		mk := live.Harness(t, os.Getenv("SPATE_STORE_URL"), 3*time.Second, storeurl.Options{})
//		conformance.RunStore(t, mk)
//		conformance.RunCoordinator(t, mk)
//	}
//
// Every harness works in a fresh namespace (job conformance-<random>) and
// deletes it when the rule ends; a deletion the deployment refuses (an ACL
// without the namespace operations) fails the rule, naming the error, since
// it leaves keys behind.
package live

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/storeurl"
)

// Harness opens the deployment at rawURL (its driver must be linked in)
// for the life of t and returns a harness maker over it with stores of
// ephemeral TTL ttl. It fails t if the URL cannot be opened.
func Harness(t testing.TB, rawURL string, ttl time.Duration, opts storeurl.Options) conformance.HarnessMaker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dep, err := storeurl.Open(ctx, rawURL, opts)
	if err != nil {
		t.Fatalf("live: %v", err)
	}
	t.Cleanup(func() { _ = dep.Close() })
	return Over(dep, ttl)
}

// Over returns a harness maker over an open deployment (the caller closes
// it after the suite).
func Over(dep storeurl.Deployment, ttl time.Duration) conformance.HarnessMaker {
	return func(t testing.TB) conformance.Harness {
		var b [6]byte
		_, _ = rand.Read(b[:])
		return &harness{dep: dep, ns: "conformance-" + hex.EncodeToString(b[:]), ttl: ttl}
	}
}

type harness struct {
	dep storeurl.Deployment
	ns  string
	ttl time.Duration

	mu     sync.Mutex
	stores []spate.Store
	closed bool
}

func (h *harness) NewStore(ctx context.Context) (spate.Store, error) {
	st, err := h.dep.Open(ctx, h.ns, h.ttl)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stores = append(h.stores, st)
	return st, nil
}

// Close closes the stores left open and deletes the namespace. Idempotent.
func (h *harness) Close() error {
	h.mu.Lock()
	stores, done := h.stores, h.closed
	h.stores, h.closed = nil, true
	h.mu.Unlock()
	for _, st := range stores {
		_ = st.Close()
	}
	if done {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.dep.DeleteJob(ctx, h.ns); err != nil {
		return fmt.Errorf("delete the namespace %s: %w", h.ns, err)
	}
	return nil
}
