package spate_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spate-go/spate"
)

func TestConfigDefaults(t *testing.T) {
	c := spate.DefaultConfig()
	if c.LeaseDuration != 30*time.Second || c.OpTimeout != 10*time.Second || c.MaxAttempts != 4 ||
		c.MaxInFlight != 8 || c.ReplanInterval != time.Minute || c.ReconcileInterval != 30*time.Second ||
		c.StartupMaxAttempts != 8 || c.RebalanceDelay != 20*time.Second || c.DrainDeadline != 10*time.Second {
		t.Fatalf("defaults: %+v", c)
	}
	if !strings.HasPrefix(c.InstanceID, "spate-") || len(c.InstanceID) != len("spate-")+32 {
		t.Fatalf("default instance id %q", c.InstanceID)
	}
	if spate.DefaultConfig().InstanceID == c.InstanceID {
		t.Fatal("default instance ids must be random per process")
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults must validate: %v", err)
	}
	if c.RenewInterval() != 10*time.Second {
		t.Fatalf("renew interval %v", c.RenewInterval())
	}
	if err := (spate.Config{RebalanceDelay: spate.NoRebalanceDelay}).Validate(); err != nil {
		t.Fatalf("NoRebalanceDelay is legal: %v", err)
	}
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
		if err == nil || !strings.Contains(err.Error(), c.rule) {
			t.Errorf("%s: Validate() = %v, want a violation naming %q", c.name, err, c.rule)
			continue
		}
		if !errors.Is(err, spate.ErrFatal) {
			t.Errorf("%s: violations are Fatal: %v", c.name, err)
		}
	}
}

func TestConfigValidateReportsEveryViolation(t *testing.T) {
	err := spate.Config{OpTimeout: time.Millisecond, MaxAttempts: -1, InstanceID: "a b"}.Validate()
	for _, want := range []string{"op_timeout", "max_attempts", "instance_id"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("joined error %v misses %q", err, want)
		}
	}
}

func TestParseConfig(t *testing.T) {
	c, err := spate.ParseConfig([]byte(`{"lease_duration":"1.5s","op_timeout":"200ms","rebalance_delay":"none","max_in_flight":3}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.LeaseDuration != 1500*time.Millisecond || c.OpTimeout != 200*time.Millisecond ||
		c.RebalanceDelay != spate.NoRebalanceDelay || c.MaxInFlight != 3 {
		t.Fatalf("parsed %+v", c)
	}
	round, err := spate.ParseConfig([]byte(c.String()))
	if err != nil || round != c {
		t.Fatalf("round trip: %+v, %v", round, err)
	}
	for _, bad := range []string{`{"lease":"1s"}`, `{"lease_duration":"soon"}`, `{"lease_duration":5}`, `{} {}`, `[`} {
		if _, err := spate.ParseConfig([]byte(bad)); !spate.IsFatal(err) {
			t.Errorf("ParseConfig(%s) = %v, want a Fatal error", bad, err)
		}
	}
}
