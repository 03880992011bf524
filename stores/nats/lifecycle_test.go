package nats_test

import (
	"testing"

	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/conformance/scale"
	"github.com/spate-go/spate/internal/natsservers"
)

// TestStoreCallsPerLifecycle counts the store calls per split lifecycle
// step on an embedded nats-server (scale.MeasureLifecycle): claim 2,
// takeover 2, commit 1, and release 2, the owner-clear and the lease
// delete: the driver has no Releaser capability (two buckets are two
// streams), and the measurement says so.
func TestStoreCallsPerLifecycle(t *testing.T) {
	t.Parallel()
	scale.MeasureLifecycle(t, func(t testing.TB) conformance.Harness { return natsservers.NewHarness(t, ttl) })
}
