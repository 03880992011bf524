package nats

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
			assert.NoError(t, err, "server %q: want accepted", tc.version)
			continue
		}
		assert.ErrorIs(t, err, tc.want, "server %q", tc.version)
	}
	err := checkServerVersion("2.10.22")
	for _, want := range []string{"2.10.22", "2.11", "upgrade"} {
		assert.ErrorContains(t, err, want, "an old server's error says %q", want)
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
		assert.Equal(t, want, subjectFilter(pre, prefix), "subjectFilter(%q)", prefix)
	}
}

func TestOptionsValidate(t *testing.T) {
	good := Options{Job: "job_1-x", TTL: 2 * time.Second}
	require.NoError(t, good.validate(), "valid options")
	assert.Equal(t, 1, good.Replicas, "defaults not applied: %+v", good)
	assert.Equal(t, DefaultMaxValueSize, good.MaxValueSize, "defaults not applied: %+v", good)
	assert.NotNil(t, good.Logger, "defaults not applied: %+v", good)
	assert.Equal(t, jetstream.FileStorage, good.Storage, "defaults not applied: %+v", good)
	bad := Options{Job: "bad job!", TTL: time.Second, Replicas: 2, Storage: jetstream.StorageType(7), MaxValueSize: -1}
	err := bad.validate()
	require.ErrorIs(t, err, spate.ErrFatal, "invalid options: want Fatal")
	for _, want := range []string{"job", "TTL", "replicas", "storage", "max value size"} {
		assert.ErrorContains(t, err, want, "every violation is reported")
	}
	long := Options{Job: strings.Repeat("j", 65), TTL: 2 * time.Second}
	assert.ErrorIs(t, long.validate(), spate.ErrFatal, "a 65-character job is refused")
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
		assert.Equal(t, tc.failover, c.LinearizableFailover, "R%d %v: LinearizableFailover", tc.replicas, tc.storage)
		assert.Equal(t, "nats", c.Driver, "capabilities misreported: %+v", c)
		assert.Equal(t, 3*time.Second, c.TTL, "capabilities misreported: %+v", c)
		assert.Equal(t, 2*time.Second, c.TTLFloor, "capabilities misreported: %+v", c)
		assert.Equal(t, 100, c.MaxValueSize, "capabilities misreported: %+v", c)
		assert.Positive(t, c.ExpiryLatency, "capabilities misreported: %+v", c)
		assert.Contains(t, strings.Join(c.RequiredSettings, "; "), "sync_interval: always", "required settings must name sync_interval: always")
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
			assert.NoError(t, err, "%s: want adopted", tc.name)
			continue
		}
		if !assert.ErrorIs(t, err, spate.ErrFatal, "%s: want a Fatal error saying %q", tc.name, tc.want) ||
			!assert.ErrorContains(t, err, tc.want, "%s: want a Fatal error saying %q", tc.name, tc.want) {
			continue
		}
		assert.ErrorContains(t, err, dname, "%s: the error names both buckets to delete", tc.name)
		assert.ErrorContains(t, err, ename, "%s: the error names both buckets to delete", tc.name)
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
		assert.Equal(t, tc.marker, isMarker(tc.hdr), "isMarker(%v)", tc.hdr)
	}
}
