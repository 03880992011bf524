package nats

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/spate-go/spate"
)

func TestCheckServerVersion(t *testing.T) {
	for _, tc := range []struct {
		version string
		want    error // nil, ErrFatal or ErrRetryable
	}{
		{"2.11.0", nil},
		{"2.11.9", nil},
		{"2.12.0-RC.1", nil},
		{"2.15.2", nil},
		{"v2.11.1", nil},
		{"3.0.0", nil},
		{"2.11", nil},
		{"2.10.22", spate.ErrFatal},
		{"2.10.99-beta", spate.ErrFatal},
		{"2.9.25", spate.ErrFatal},
		{"1.4.1", spate.ErrFatal},
		{"2.1", spate.ErrFatal},
		{"garbage", spate.ErrFatal},
		{"2.x.0", spate.ErrFatal},
		{"", spate.ErrRetryable},
	} {
		err := checkServerVersion(tc.version)
		if tc.want == nil {
			if err != nil {
				t.Errorf("server %q: want accepted, got %v", tc.version, err)
			}
			continue
		}
		if !errors.Is(err, tc.want) {
			t.Errorf("server %q: want %v, got %v", tc.version, tc.want, err)
		}
	}
	err := checkServerVersion("2.10.22")
	for _, want := range []string{"2.10.22", "2.11", "upgrade"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("an old server's error says %q: got %v", want, err)
		}
	}
}

func TestSubjectFilter(t *testing.T) {
	const pre = "$KV.b."
	for prefix, want := range map[string]string{
		"":           "$KV.b.>",
		"spl":        "$KV.b.>",
		"split.":     "$KV.b.split.>",
		"split.a":    "$KV.b.split.>",
		"a.b.c":      "$KV.b.a.b.>",
		"assign.w-1": "$KV.b.assign.>",
	} {
		if got := subjectFilter(pre, prefix); got != want {
			t.Errorf("subjectFilter(%q) = %q, want %q", prefix, got, want)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	good := Options{Job: "job_1-x", TTL: 2 * time.Second}
	if err := good.validate(); err != nil {
		t.Fatalf("valid options: %v", err)
	}
	if good.Replicas != 1 || good.MaxValueSize != DefaultMaxValueSize || good.Logger == nil || good.Storage != jetstream.FileStorage {
		t.Errorf("defaults not applied: %+v", good)
	}
	bad := Options{Job: "bad job!", TTL: time.Second, Replicas: 2, Storage: jetstream.StorageType(7), MaxValueSize: -1}
	err := bad.validate()
	if !errors.Is(err, spate.ErrFatal) {
		t.Fatalf("invalid options: want Fatal, got %v", err)
	}
	for _, want := range []string{"job", "TTL", "replicas", "storage", "max value size"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("every violation is reported; %q missing from %v", want, err)
		}
	}
	long := Options{Job: strings.Repeat("j", 65), TTL: 2 * time.Second}
	if err := long.validate(); !errors.Is(err, spate.ErrFatal) {
		t.Errorf("a 65-character job is refused; got %v", err)
	}
}

func TestCapabilitiesAreHonest(t *testing.T) {
	for _, tc := range []struct {
		replicas int
		storage  jetstream.StorageType
		failover bool
	}{
		{1, jetstream.FileStorage, false},
		{3, jetstream.FileStorage, true},
		{5, jetstream.FileStorage, true},
		{3, jetstream.MemoryStorage, false},
		{1, jetstream.MemoryStorage, false},
	} {
		c := capabilities(Options{Job: "j", TTL: 3 * time.Second, Replicas: tc.replicas, Storage: tc.storage, MaxValueSize: 100})
		if c.LinearizableFailover != tc.failover {
			t.Errorf("R%d %v: LinearizableFailover %t, want %t", tc.replicas, tc.storage, c.LinearizableFailover, tc.failover)
		}
		if c.Driver != "nats" || c.TTL != 3*time.Second || c.TTLFloor != 2*time.Second || c.MaxValueSize != 100 || c.ExpiryLatency <= 0 {
			t.Errorf("capabilities misreported: %+v", c)
		}
		if !strings.Contains(strings.Join(c.RequiredSettings, "; "), "sync_interval: always") {
			t.Errorf("required settings must name sync_interval: always; got %v", c.RequiredSettings)
		}
	}
}

func TestCheckAdopt(t *testing.T) {
	s := &store{opts: Options{Job: "j", TTL: 2 * time.Second, Replicas: 3, MaxValueSize: DefaultMaxValueSize}}
	dname, ename := Buckets("j")
	mutate := func(ks spate.Keyspace, f func(*jetstream.StreamConfig)) jetstream.StreamConfig {
		c := s.streamConfig(ks, dname)
		if ks == spate.Ephemeral {
			c = s.streamConfig(ks, ename)
		}
		f(&c)
		return c
	}
	for _, tc := range []struct {
		name string
		ks   spate.Keyspace
		f    func(*jetstream.StreamConfig)
		want string // "" = adopted
	}{
		{"same durable", spate.Durable, func(*jetstream.StreamConfig) {}, ""},
		{"same ephemeral", spate.Ephemeral, func(*jetstream.StreamConfig) {}, ""},
		{"bigger message cap", spate.Durable, func(c *jetstream.StreamConfig) { c.MaxMsgSize = 1 << 20 }, ""},
		{"other TTL", spate.Ephemeral, func(c *jetstream.StreamConfig) { c.MaxAge = 5 * time.Second }, "lease duration cannot change mid-job"},
		{"durable with max age", spate.Durable, func(c *jetstream.StreamConfig) { c.MaxAge = time.Hour }, "lease duration cannot change mid-job"},
		{"other replicas", spate.Durable, func(c *jetstream.StreamConfig) { c.Replicas = 1 }, "replicas"},
		{"other storage", spate.Durable, func(c *jetstream.StreamConfig) { c.Storage = jetstream.MemoryStorage }, "storage"},
		{"direct get", spate.Durable, func(c *jetstream.StreamConfig) { c.AllowDirect = true }, "direct get"},
		{"history", spate.Durable, func(c *jetstream.StreamConfig) { c.MaxMsgsPerSubject = 5 }, "revisions per key"},
		{"no markers", spate.Ephemeral, func(c *jetstream.StreamConfig) { c.SubjectDeleteMarkerTTL = 0 }, "limit markers"},
		{"small cap", spate.Durable, func(c *jetstream.StreamConfig) { c.MaxMsgSize = 1024 }, "caps messages"},
	} {
		want := s.streamConfig(tc.ks, dname)
		name := dname
		if tc.ks == spate.Ephemeral {
			want, name = s.streamConfig(tc.ks, ename), ename
		}
		err := checkAdopt(tc.ks, name, mutate(tc.ks, tc.f), want, dname, ename)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: want adopted, got %v", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, spate.ErrFatal) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: want a Fatal error saying %q, got %v", tc.name, tc.want, err)
			continue
		}
		if !strings.Contains(err.Error(), dname) || !strings.Contains(err.Error(), ename) {
			t.Errorf("%s: the error names both buckets to delete: %v", tc.name, err)
		}
	}
}

func TestIsMarker(t *testing.T) {
	// Get, List and the watch snapshot rely on isMarker to hide deletes.
	for _, tc := range []struct {
		hdr    map[string][]string
		marker bool
	}{
		{nil, false},
		{map[string][]string{"KV-Operation": {"DEL"}}, true},
		{map[string][]string{"KV-Operation": {"PURGE"}}, true},
		{map[string][]string{"Nats-Marker-Reason": {"MaxAge"}}, true},
		{map[string][]string{"Nats-Marker-Reason": {"Remove"}}, true},
		{map[string][]string{"Other": {"x"}}, false},
	} {
		if got := isMarker(tc.hdr); got != tc.marker {
			t.Errorf("isMarker(%v) = %t, want %t", tc.hdr, got, tc.marker)
		}
	}
}
