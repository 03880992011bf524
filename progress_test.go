package spate

import (
	"bytes"
	"errors"
	"strings"
	"testing"

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
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if !bytes.Equal(encode(got), encode(r)) {
			t.Fatalf("round trip changed the record:\n%s\n%s", encode(r), encode(got))
		}
	})
}

func TestRecordParseErrorsAreDistinctAndActionable(t *testing.T) {
	fp := FingerprintHash("job:v1")
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
		if err == nil || !errors.Is(err, ErrFatal) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want a Fatal error mentioning %q", c.name, err, c.want)
		}
	}
	if _, err := decodePlan("plan", encode(&planRecord{Schema: 1, Fingerprint: "job:v2", Finality: "open"}), "job:v1"); err == nil ||
		!strings.Contains(err.Error(), "job:v1") || !strings.Contains(err.Error(), "job:v2") {
		t.Errorf("a plan fingerprint mismatch must show both values: %v", err)
	}
}

func TestFingerprintHashDecodesAsUint64(t *testing.T) {
	fp := FingerprintHash("a fingerprint whose hash exceeds 2^53")
	r := newProgressRecord("s", fp, nil)
	got, err := decodeProgress("split.s", "s", encode(r), fp)
	if err != nil || got.FP != fp {
		t.Fatalf("fp %d decoded as %v (%v)", fp, got, err)
	}
	if FingerprintHash("x") == FingerprintHash("y") {
		t.Fatal("distinct fingerprints collide")
	}
}

func TestSeededCompletedRecordIsTerminal(t *testing.T) {
	r := newProgressRecord("s", 1, &SplitProgress{Watermark: 9, Completed: true})
	if r.Status != statusCompleted || !r.Completed || *r.Watermark != 9 {
		t.Fatalf("got %+v", r)
	}
	if newProgressRecord("s", 1, nil).progress() != nil {
		t.Fatal("a record without a watermark carries no progress")
	}
}

func TestAssignmentRejectsAlienShapes(t *testing.T) {
	for _, bad := range []string{`{}`, `{"schema":1,"generation":1}`, `{"schema":1,"generation":1,"splits":["a.b"]}`, `[]`, `garbage`} {
		if _, err := decodeAssignment("assign.x", []byte(bad)); err == nil {
			t.Errorf("assignment %s must not read as a valid (possibly empty) assignment", bad)
		}
	}
	a, err := decodeAssignment("assign.x", []byte(`{"schema":1,"generation":2,"splits":[]}`))
	if err != nil || len(a.Splits) != 0 || a.Splits == nil {
		t.Fatalf("an explicit empty assignment is valid: %v %v", a, err)
	}
}

func TestKeyPrefixesDoNotShadow(t *testing.T) {
	prefixes := []string{keyPlan, keyLeader, prefixSpec, prefixSplit, prefixAssign, prefixWorker, prefixProbe}
	for i, a := range prefixes {
		for j, b := range prefixes {
			if i != j && strings.HasPrefix(a, b) {
				t.Errorf("%q shadows %q", b, a)
			}
		}
	}
}
