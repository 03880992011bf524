package spate

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestProgressRecordRoundTrips(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		fp := rapid.Uint64().Draw(t, "fp")
		r := &progressRecord{Schema: SchemaVersion, ID: "s-1", FP: fp,
			Epoch:    rapid.Uint64().Draw(t, "epoch"),
			Status:   rapid.SampledFrom([]string{statusRunnable, statusCompleted, statusQuarant}).Draw(t, "status"),
			Attempts: rapid.Uint32().Draw(t, "attempts"), Completed: rapid.Bool().Draw(t, "completed"),
			WrittenAtMs: rapid.Int64().Draw(t, "ts")}
		if rapid.Bool().Draw(t, "owned") {
			r.Owner = strPtr("w-" + rapid.StringMatching(`[a-z0-9]{1,8}`).Draw(t, "owner"))
		}
		if rapid.Bool().Draw(t, "hasWatermark") {
			w := rapid.Int64().Draw(t, "watermark")
			r.Watermark = &w
			r.State = rapid.SliceOf(rapid.Byte()).Draw(t, "state")
		}
		got, err := decodeProgress("split.s-1", "s-1", encode(r), fp)
		require.NoError(t, err, "decode")
		require.Equal(t, string(encode(r)), string(encode(got)), "round trip changed the record")
	})
}

func TestRecordParseErrorsAreDistinctAndActionable(t *testing.T) {
	fp := fingerprintHash("job:v1")
	good := encode(newProgressRecord("s-1", fp, nil))
	cases := []struct {
		name, data, want string
	}{
		{"garbage", "not json", "split.s-1"},
		{"unknown field", strings.Replace(string(good), `"schema"`, `"extra":1,"schema"`, 1), "unknown field"},
		{"wrong schema", strings.Replace(string(good), `"schema":1`, `"schema":3`, 1), "schema 3"},
		{"id mismatch", strings.Replace(string(good), `"id":"s-1"`, `"id":"s-2"`, 1), "does not match the key"},
		{"fingerprint", strings.Replace(string(good), `"fp":`, `"fp":1`, 1), "two jobs share a namespace"},
		{"bad status", strings.Replace(string(good), `"runnable"`, `"running"`, 1), "status"},
		{"trailing", string(good) + "{}", "trailing"},
	}
	for _, c := range cases {
		_, err := decodeProgress("split.s-1", "s-1", []byte(c.data), fp)
		assert.ErrorIs(t, err, ErrFatal, "%s: got %v, want a Fatal error mentioning %q", c.name, err, c.want)
		assert.ErrorContains(t, err, c.want, "%s: got %v, want a Fatal error mentioning %q", c.name, err, c.want)
	}
	_, err := decodePlan("plan", encode(&planRecord{Schema: 1, Fingerprint: "job:v2", Finality: "open"}), "job:v1")
	assert.ErrorContains(t, err, "job:v1", "a plan fingerprint mismatch must show both values: %v", err)
	assert.ErrorContains(t, err, "job:v2", "a plan fingerprint mismatch must show both values: %v", err)
}

func TestFingerprintHashDecodesAsUint64(t *testing.T) {
	fp := fingerprintHash("a fingerprint whose hash exceeds 2^53")
	r := newProgressRecord("s", fp, nil)
	got, err := decodeProgress("split.s", "s", encode(r), fp)
	require.NoError(t, err, "fp %d decoded as %v (%v)", fp, got, err)
	require.Equal(t, fp, got.FP, "fp %d decoded as %v (%v)", fp, got, err)
	require.NotEqual(t, fingerprintHash("x"), fingerprintHash("y"), "distinct fingerprints collide")
}

func TestSeededCompletedRecordIsTerminal(t *testing.T) {
	r := newProgressRecord("s", 1, &SplitProgress{Watermark: 9, Completed: true})
	require.Equal(t, statusCompleted, r.Status, "got %+v", r)
	require.True(t, r.Completed, "got %+v", r)
	require.Equal(t, int64(9), *r.Watermark, "got %+v", r)
	require.Nil(t, newProgressRecord("s", 1, nil).progress(), "a record without a watermark carries no progress")
}

func TestCheckMonotone(t *testing.T) {
	cases := []struct {
		name string
		cur  *int64
		next int64
		ok   bool
	}{
		{"first commit", nil, 0, true},
		{"first commit, negative watermark", nil, -5, true},
		{"unchanged", wm(7), 7, true},
		{"forward", wm(7), 8, true},
		{"back by one", wm(7), 6, false},
		{"back below zero", wm(0), -1, false},
	}
	for _, c := range cases {
		err := checkMonotone("s-1", c.cur, c.next)
		if c.ok {
			require.NoError(t, err, c.name)
			continue
		}
		require.Error(t, err, c.name)
		assert.True(t, errors.Is(err, ErrFatal), "%s: a regression is Fatal: %v", c.name, err)
		assert.Contains(t, err.Error(), "s-1", c.name)
		assert.Contains(t, err.Error(), fmt.Sprintf("from %d to %d", *c.cur, c.next), c.name)
	}
}

func TestProgressCloneIsDeep(t *testing.T) {
	r := rec("s", 1, "me")
	r.Watermark = wm(4)
	c := r.clone()
	*c.Owner, *c.Watermark = "other", 9
	assert.Equal(t, "me", r.owner())
	assert.Equal(t, int64(4), *r.Watermark)
	assert.Equal(t, &SplitProgress{Watermark: 4, State: []byte{}}, r.progress(), "a nil state is handed over as empty")
}
