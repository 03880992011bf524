package spate_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
)

func TestConfigDefaults(t *testing.T) {
	c := spate.Config{}.WithDefaults()
	require.Equal(t, 30*time.Second, c.LeaseDuration, "defaults: %+v", c)
	require.Equal(t, 10*time.Second, c.OpTimeout, "defaults: %+v", c)
	require.Equal(t, 4, c.MaxAttempts, "defaults: %+v", c)
	require.Equal(t, 8, c.MaxInFlight, "defaults: %+v", c)
	require.Equal(t, time.Minute, c.ReplanInterval, "defaults: %+v", c)
	require.Equal(t, 30*time.Second, c.ReconcileInterval, "defaults: %+v", c)
	require.Equal(t, 8, c.StartupMaxAttempts, "defaults: %+v", c)
	require.Equal(t, 20*time.Second, c.RebalanceDelay, "defaults: %+v", c)
	require.Equal(t, 10*time.Second, c.DrainDeadline, "defaults: %+v", c)
	require.True(t, strings.HasPrefix(c.InstanceID, "spate-"), "default instance id %q", c.InstanceID)
	require.Len(t, c.InstanceID, len("spate-")+32, "default instance id %q", c.InstanceID)
	require.NotEqual(t, c.InstanceID, spate.Config{}.WithDefaults().InstanceID, "default instance ids must be random per process")
	require.NoError(t, c.Validate(), "defaults must validate")
	require.NoError(t, (spate.Config{RebalanceDelay: spate.NoRebalanceDelay}).Validate(), "NoRebalanceDelay is legal")
}

func TestConfigFloorsNameTheirRule(t *testing.T) {
	cases := []struct {
		name string
		cfg  spate.Config
		rule string
	}{
		{"lease floor", spate.Config{LeaseDuration: 100 * time.Millisecond, OpTimeout: 50 * time.Millisecond}, "lease_duration must be >= 300ms"},
		{"op floor", spate.Config{OpTimeout: 10 * time.Millisecond}, "op_timeout must be >= 50ms"},
		{"lease vs op", spate.Config{LeaseDuration: time.Second, OpTimeout: 600 * time.Millisecond, DrainDeadline: time.Second}, "lease_duration must be >= 2 x op_timeout"},
		{"replan", spate.Config{LeaseDuration: 30 * time.Second, ReplanInterval: time.Second}, "replan_interval must be >= lease_duration"},
		{"drain", spate.Config{DrainDeadline: time.Second}, "drain_deadline must be >= op_timeout"},
		{"rebalance", spate.Config{RebalanceDelay: -5 * time.Second}, "rebalance_delay must be >= 0"},
		{"attempts", spate.Config{MaxAttempts: -1}, "max_attempts must be >= 1"},
		{"in flight", spate.Config{MaxInFlight: -3}, "max_in_flight must be >= 1"},
		{"startup", spate.Config{StartupMaxAttempts: -1}, "startup_max_attempts must be >= 1"},
		{"instance", spate.Config{InstanceID: "pod.name"}, "instance_id"},
		{"negative", spate.Config{ReconcileInterval: -time.Second}, "reconcile_interval must be positive"},
	}
	for _, c := range cases {
		err := c.cfg.Validate()
		if !assert.ErrorContains(t, err, c.rule, "%s: Validate() = %v, want a violation naming %q", c.name, err, c.rule) {
			continue
		}
		assert.ErrorIs(t, err, spate.ErrFatal, "%s: violations are Fatal", c.name)
	}
}

func TestConfigValidateReportsEveryViolation(t *testing.T) {
	err := spate.Config{OpTimeout: time.Millisecond, MaxAttempts: -1, InstanceID: "a b"}.Validate()
	for _, want := range []string{"op_timeout", "max_attempts", "instance_id"} {
		assert.ErrorContains(t, err, want, "joined error %v misses %q", err, want)
	}
}
