package spate

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"time"
)

// Defaults of the [Config] knobs. A zero field takes its default.
const (
	DefaultLeaseDuration      = 30 * time.Second
	DefaultOpTimeout          = 10 * time.Second
	DefaultMaxAttempts        = 4
	DefaultMaxInFlight        = 8
	DefaultReplanInterval     = 60 * time.Second
	DefaultReconcileInterval  = 30 * time.Second
	DefaultStartupMaxAttempts = 8
	DefaultRebalanceDelay     = 20 * time.Second
	DefaultDrainDeadline      = 10 * time.Second
)

// Mechanical floors: below these the protocol is unsound, even in tests.
const (
	// MinLeaseDuration is the smallest lease the protocol accepts.
	MinLeaseDuration = 300 * time.Millisecond
	// MinOpTimeout is the smallest per-operation deadline.
	MinOpTimeout = 50 * time.Millisecond
)

// NoRebalanceDelay as [Config.RebalanceDelay] reassigns a departed
// instance's splits immediately. It takes its own path through the
// assignment: a zero that flowed through the general "withheld until"
// comparison is how "immediately" once became "never".
const NoRebalanceDelay time.Duration = -1

// Config holds the coordinator's knobs. The zero value of every field means
// its default; [Config.WithDefaults] fills them in and [Config.Validate]
// checks the mechanical floors.
type Config struct {
	// LeaseDuration is how long a lease lives without renewal: the ceiling
	// on takeover latency after an ungraceful death. Leases are renewed
	// every third of it. It must equal the store's TTL. Default 30s; floor
	// 300ms and at least 2×OpTimeout, so one slow write cannot outlive the
	// lease it renews.
	LeaseDuration time.Duration
	// OpTimeout bounds every store operation except List. A command on the
	// handle waits at most 3×OpTimeout. Default 10s; floor 50ms.
	OpTimeout time.Duration
	// InstanceID identifies this worker: 1–128 bytes of [A-Za-z0-9_-],
	// unique among live workers (two live workers with one id stop Fatal).
	// A stable id (a pod name) lets a restarted worker reclaim its splits
	// without waiting out their leases. Default: "spate-" and 32 random hex
	// digits, new per process.
	InstanceID string
	// MaxAttempts is the number of delivery attempts after which a split is
	// quarantined. An attempt is spent on evidence against the split: an
	// explicit Fail, or a tenancy that ended without a graceful release
	// (its owner died) and had not moved the watermark forward. Store
	// faults, self-fences and deaths of progressing tenancies never spend
	// one. Default 4; at least 1.
	MaxAttempts int
	// MaxInFlight bounds this worker's working set (its lane count). It is
	// advertised to the leader, which never assigns a member more. Default 8.
	MaxInFlight int
	// ReplanInterval is how often the leader re-runs an open plan. Default
	// 60s; at least LeaseDuration (replanning faster than a leader failure
	// can be noticed is churn, not freshness).
	ReplanInterval time.Duration
	// ReconcileInterval is how often every worker lists both keyspaces as a
	// backstop for missed watch events. Default 30s.
	ReconcileInterval time.Duration
	// StartupMaxAttempts bounds the retries of the startup phases (store
	// probe, join, presence); backoff starts at 200ms, doubles, caps at 5s.
	// Default 8.
	StartupMaxAttempts int
	// RebalanceDelay withholds a departed instance's splits so that a pod
	// bounce reclaims its own work; a returning instance cancels it. Default
	// 20s. Set [NoRebalanceDelay] to reassign immediately. It applies only
	// to a stable InstanceID: a worker whose id was generated (one of the
	// form spate-<32 hex digits>) can never come back, and its splits are
	// reassigned as soon as its leases expire.
	RebalanceDelay time.Duration
	// DrainDeadline bounds a cooperative revocation: after it the release
	// is forced (and the uncommitted tail replays). For a revocation the
	// leader withdrew, it is a silence timeout instead: a drain that
	// commits nothing for this long is forced. Default 10s; at least
	// OpTimeout, or every drain would be forced before its final commit
	// could land. Size it against your sink's flush time.
	DrainDeadline time.Duration
}

// WithDefaults returns c with every zero field set to its default; an
// empty InstanceID gets a fresh random one. Config{}.WithDefaults() is the
// default config.
func (c Config) WithDefaults() Config {
	setDur := func(d *time.Duration, def time.Duration) {
		if *d == 0 {
			*d = def
		}
	}
	setDur(&c.LeaseDuration, DefaultLeaseDuration)
	setDur(&c.OpTimeout, DefaultOpTimeout)
	setDur(&c.ReplanInterval, DefaultReplanInterval)
	setDur(&c.ReconcileInterval, DefaultReconcileInterval)
	setDur(&c.RebalanceDelay, DefaultRebalanceDelay)
	setDur(&c.DrainDeadline, DefaultDrainDeadline)
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.StartupMaxAttempts == 0 {
		c.StartupMaxAttempts = DefaultStartupMaxAttempts
	}
	if c.InstanceID == "" {
		c.InstanceID = generatedIDPrefix + randomHex()
	}
	return c
}

// generatedIDPrefix starts every generated instance id: the prefix and 32
// lowercase hex digits.
const generatedIDPrefix = "spate-"

// isGeneratedID reports whether id has the form of a generated instance id
// (spate- and 32 lowercase hex digits): no process can come back under
// it, so the leader holds no rebalance delay for it once it departs,
// whether or not it ever saw the worker's presence.
func isGeneratedID(id string) bool {
	hex, ok := strings.CutPrefix(id, generatedIDPrefix)
	if !ok || len(hex) != 32 {
		return false
	}
	for _, c := range hex {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// randomHex returns 32 random hex digits (128 bits).
func randomHex() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// Validate checks c, with defaults applied, against every rule and returns
// all violations joined, each a Fatal error naming the rule it breaks.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	rule := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, Fatalf("config: "+format, args...))
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"lease_duration", c.LeaseDuration},
		{"op_timeout", c.OpTimeout},
		{"replan_interval", c.ReplanInterval},
		{"reconcile_interval", c.ReconcileInterval},
		{"drain_deadline", c.DrainDeadline},
	} {
		rule(d.v > 0, "%s must be positive, got %v", d.name, d.v)
	}
	rule(c.LeaseDuration >= MinLeaseDuration,
		"lease_duration must be >= %v (mechanical floor), got %v", MinLeaseDuration, c.LeaseDuration)
	rule(c.OpTimeout >= MinOpTimeout,
		"op_timeout must be >= %v (mechanical floor), got %v", MinOpTimeout, c.OpTimeout)
	rule(c.LeaseDuration >= 2*c.OpTimeout,
		"lease_duration must be >= 2 x op_timeout so one slow write cannot outlive the lease it renews, got lease %v and op_timeout %v",
		c.LeaseDuration, c.OpTimeout)
	rule(c.ReplanInterval >= c.LeaseDuration,
		"replan_interval must be >= lease_duration (replanning faster than leader failure can be observed is churn), got %v < %v",
		c.ReplanInterval, c.LeaseDuration)
	rule(c.DrainDeadline >= c.OpTimeout,
		"drain_deadline must be >= op_timeout or every revocation is forced before its final commit can land, got %v < %v",
		c.DrainDeadline, c.OpTimeout)
	rule(c.RebalanceDelay >= 0 || c.RebalanceDelay == NoRebalanceDelay,
		"rebalance_delay must be >= 0 or NoRebalanceDelay (-1ns), got %v", c.RebalanceDelay)
	rule(c.MaxAttempts >= 1, "max_attempts must be >= 1, got %d", c.MaxAttempts)
	rule(c.MaxInFlight >= 1, "max_in_flight must be >= 1, got %d", c.MaxInFlight)
	rule(c.StartupMaxAttempts >= 1, "startup_max_attempts must be >= 1, got %d", c.StartupMaxAttempts)
	if err := ValidateInstanceID(c.InstanceID); err != nil {
		errs = append(errs, Fatalf("config: instance_id: %w", err))
	}
	return errors.Join(errs...)
}

// TimingsForLease returns a Config whose timing knobs are derived from one
// lease, so that a caller that chooses only the lease gets a consistent set:
//
//   - LeaseDuration: lease (zero: DefaultLeaseDuration);
//   - OpTimeout: a quarter of the lease, at most 5s (one slow write cannot
//     outlive the lease it renews);
//   - ReplanInterval: DefaultReplanInterval, or the lease if longer;
//   - ReconcileInterval: the lease, between 1s and DefaultReconcileInterval;
//   - DrainDeadline: DefaultDrainDeadline, or OpTimeout if longer.
//
// The other fields are zero (their defaults): set them on the result. Any
// lease of at least MinLeaseDuration gives a Config that passes
// [Config.Validate]; a shorter one fails it, naming lease_duration.
func TimingsForLease(lease time.Duration) Config {
	if lease == 0 {
		lease = DefaultLeaseDuration
	}
	op := min(5*time.Second, lease/4)
	return Config{
		LeaseDuration:     lease,
		OpTimeout:         op,
		ReplanInterval:    max(DefaultReplanInterval, lease),
		ReconcileInterval: min(DefaultReconcileInterval, max(lease, time.Second)),
		DrainDeadline:     max(DefaultDrainDeadline, op),
	}
}

// configJSON mirrors Config with durations as Go duration strings.
type configJSON struct {
	LeaseDuration      string `json:"lease_duration,omitempty"`
	OpTimeout          string `json:"op_timeout,omitempty"`
	InstanceID         string `json:"instance_id,omitempty"`
	MaxAttempts        int    `json:"max_attempts,omitempty"`
	MaxInFlight        int    `json:"max_in_flight,omitempty"`
	ReplanInterval     string `json:"replan_interval,omitempty"`
	ReconcileInterval  string `json:"reconcile_interval,omitempty"`
	StartupMaxAttempts int    `json:"startup_max_attempts,omitempty"`
	RebalanceDelay     string `json:"rebalance_delay,omitempty"`
	DrainDeadline      string `json:"drain_deadline,omitempty"`
}

// MarshalJSON writes durations as strings ("30s").
func (c Config) MarshalJSON() ([]byte, error) {
	d := func(v time.Duration) string {
		if v == 0 {
			return ""
		}
		if v == NoRebalanceDelay {
			return "none"
		}
		return v.String()
	}
	return json.Marshal(configJSON{
		LeaseDuration: d(c.LeaseDuration), OpTimeout: d(c.OpTimeout), InstanceID: c.InstanceID,
		MaxAttempts: c.MaxAttempts, MaxInFlight: c.MaxInFlight,
		ReplanInterval: d(c.ReplanInterval), ReconcileInterval: d(c.ReconcileInterval),
		StartupMaxAttempts: c.StartupMaxAttempts, RebalanceDelay: d(c.RebalanceDelay),
		DrainDeadline: d(c.DrainDeadline),
	})
}

// parseConfig decodes a JSON config strictly: unknown fields, trailing data
// and malformed durations are errors. Durations are Go duration strings
// ("1.5s"); rebalance_delay also accepts "none" for [NoRebalanceDelay]. The
// result is not validated; call [Config.Validate].
func parseConfig(data []byte) (Config, error) {
	var j configJSON
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		return Config{}, Fatalf("config: %w", err)
	}
	if dec.More() {
		return Config{}, Fatalf("config: trailing data after the JSON object")
	}
	var errs []error
	d := func(name, s string) time.Duration {
		if s == "" {
			return 0
		}
		if name == "rebalance_delay" && s == "none" {
			return NoRebalanceDelay
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			errs = append(errs, Fatalf("config: %s: %w", name, err))
		}
		return v
	}
	c := Config{
		LeaseDuration:      d("lease_duration", j.LeaseDuration),
		OpTimeout:          d("op_timeout", j.OpTimeout),
		InstanceID:         j.InstanceID,
		MaxAttempts:        j.MaxAttempts,
		MaxInFlight:        j.MaxInFlight,
		ReplanInterval:     d("replan_interval", j.ReplanInterval),
		ReconcileInterval:  d("reconcile_interval", j.ReconcileInterval),
		StartupMaxAttempts: j.StartupMaxAttempts,
		RebalanceDelay:     d("rebalance_delay", j.RebalanceDelay),
		DrainDeadline:      d("drain_deadline", j.DrainDeadline),
	}
	if len(errs) > 0 {
		return Config{}, errors.Join(errs...)
	}
	return c, nil
}

// UnmarshalJSON decodes a JSON config strictly: unknown fields and
// malformed durations are Fatal errors. Durations are Go duration strings
// ("1.5s"); rebalance_delay also accepts "none" for [NoRebalanceDelay]. The
// result is not validated; call [Config.Validate].
func (c *Config) UnmarshalJSON(data []byte) error {
	v, err := parseConfig(data)
	if err != nil {
		return err
	}
	*c = v
	return nil
}

// String renders the effective knobs for logs.
func (c Config) String() string {
	b, _ := c.MarshalJSON()
	return string(b)
}
