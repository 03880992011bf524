package mem_test

import (
	"testing"

	"github.com/spate-go/spate/conformance/scale"
)

// TestStoreCallsPerLifecycle counts the store calls per split lifecycle
// step on stores/mem (scale.MeasureLifecycle): claim 2, takeover 2,
// commit 1, release 1 (UpdateAndDelete), 2 with the capability hidden.
func TestStoreCallsPerLifecycle(t *testing.T) {
	t.Parallel()
	scale.MeasureLifecycle(t, newHarness)
}
