package conformance_test

import (
	"testing"
	"time"

	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/stores/etcd/etcdtest"
)

func TestStore(t *testing.T) { conformance.RunStore(t, etcdtest.Start(t).HarnessMaker(2*time.Second)) }

func TestCoordinator(t *testing.T) {
	conformance.RunCoordinator(t, etcdtest.Start(t).HarnessMaker(2*time.Second))
}
