package nats_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/internal/natstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ttl is the lease TTL of the tests: the NATS floor, to keep wall time down.
const ttl = 2 * time.Second

func TestStoreConformance(t *testing.T) {
	conformance.RunStore(t, func(t *testing.T) conformance.Harness {
		return natstest.NewHarness(t, ttl)
	})
}
