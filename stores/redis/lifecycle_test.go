package redis_test

import (
	"testing"

	"github.com/spate-go/spate/conformance/scale"
	"github.com/spate-go/spate/internal/redisservers"
)

// TestStoreCallsPerLifecycle counts the store calls per split lifecycle
// step on a real redis-server (scale.MeasureLifecycle): claim 2,
// takeover 2, commit 1, release 1 (the UpdateAndDelete script), 2 with
// the capability hidden.
func TestStoreCallsPerLifecycle(t *testing.T) {
	t.Parallel()
	scale.MeasureLifecycle(t, redisservers.Start(t).HarnessMaker(testTTL))
}
