package mem_test

import (
	"context"
	"testing"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/stores/mem"
)

// harness shares one in-memory store between the clients of a test.
type harness struct{ root *mem.Store }

func (h harness) NewStore(context.Context) (spate.Store, error) { return h.root.Connect() }
func (h harness) Close() error                                  { return h.root.Close() }

func newHarness(t testing.TB) conformance.Harness {
	return harness{root: mem.MustNew(mem.Options{TTL: 1500 * time.Millisecond})}
}

func TestStoreConformance(t *testing.T) {
	conformance.RunStore(t, newHarness, conformance.VirtualTime())
}
