package etcd_test

import (
	"testing"

	"github.com/spate-go/spate/conformance/scale"
	"github.com/spate-go/spate/stores/etcd/etcdtest"
)

// TestStoreCallsPerLifecycle counts the store calls per split lifecycle
// step on an embedded etcd (scale.MeasureLifecycle): claim 2,
// takeover 2, commit 1, release 1 (one Txn), 2 with the capability hidden.
func TestStoreCallsPerLifecycle(t *testing.T) {
	t.Parallel()
	scale.MeasureLifecycle(t, etcdtest.Start(t).HarnessMaker(testTTL))
}
