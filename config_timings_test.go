package spate_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
)

// A worker that only chooses its lease derives the other timings from it.
func ExampleTimingsForLease() {
	cfg := spate.TimingsForLease(2 * time.Second)
	cfg.InstanceID = "worker-1"
	cfg.MaxInFlight = 4
	fmt.Println("op timeout:", cfg.OpTimeout)
	fmt.Println("replan:", cfg.ReplanInterval)
	fmt.Println("reconcile:", cfg.ReconcileInterval)
	fmt.Println("drain deadline:", cfg.DrainDeadline)
	fmt.Println("valid:", cfg.Validate() == nil)
	// Output:
	// op timeout: 500ms
	// replan: 1m0s
	// reconcile: 2s
	// drain deadline: 10s
	// valid: true
}

// Every lease from the floor up derives a valid Config; below the floor
// Validate names the lease.
func TestTimingsForLeaseValidates(t *testing.T) {
	for _, lease := range []time.Duration{spate.MinLeaseDuration, time.Second, 2 * time.Second, 15 * time.Second,
		spate.DefaultLeaseDuration, 2 * time.Minute, time.Hour} {
		cfg := spate.TimingsForLease(lease)
		cfg.InstanceID = "w"
		require.NoError(t, cfg.Validate(), "lease %v", lease)
		assert.Equal(t, lease, cfg.LeaseDuration)
		assert.LessOrEqual(t, 2*cfg.OpTimeout, lease, "lease %v", lease)
		assert.GreaterOrEqual(t, cfg.ReplanInterval, lease, "lease %v", lease)
		assert.GreaterOrEqual(t, cfg.DrainDeadline, cfg.OpTimeout, "lease %v", lease)
	}
	assert.Equal(t, spate.DefaultLeaseDuration, spate.TimingsForLease(0).LeaseDuration)
	err := spate.TimingsForLease(100 * time.Millisecond).Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "lease_duration must be >= 300ms")
}
