package spate

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestAssignmentRejectsAlienShapes(t *testing.T) {
	for _, bad := range []string{`{}`, `{"schema":1,"generation":1}`, `{"schema":1,"generation":1,"splits":["a.b"]}`, `[]`, `garbage`} {
		_, err := decodeAssignment("assign.x", []byte(bad))
		assert.Error(t, err, "assignment %s must not read as a valid (possibly empty) assignment", bad)
	}
	a, err := decodeAssignment("assign.x", []byte(`{"schema":1,"generation":2,"splits":[]}`))
	require.NoError(t, err, "an explicit empty assignment is valid: %v %v", a, err)
	require.NotNil(t, a.Splits, "an explicit empty assignment is valid: %v %v", a, err)
	require.Empty(t, a.Splits, "an explicit empty assignment is valid: %v %v", a, err)
}

func TestKeyPrefixesDoNotShadow(t *testing.T) {
	prefixes := []string{keyPlan, keyLeader, prefixSpec, prefixSplit, prefixAssign, prefixWorker, prefixProbe}
	for i, a := range prefixes {
		for j, b := range prefixes {
			if i != j {
				assert.False(t, strings.HasPrefix(a, b), "%q shadows %q", b, a)
			}
		}
	}
}

// Assignment errors are not Fatal: an unreadable assignment costs balance,
// never safety.
func TestAssignmentErrorsAreNotFatal(t *testing.T) {
	_, err := decodeAssignment("assign.x", []byte(`{"schema":1,"generation":1}`))
	require.Error(t, err)
	assert.False(t, errors.Is(err, ErrFatal))
	assert.Contains(t, err.Error(), "assign.x")
}

func TestEphemeralRecordsRoundTripAndRejectAlienShapes(t *testing.T) {
	l := leaseVal{Schema: SchemaVersion, Owner: "w-1", Nonce: "abc", Epoch: 7}
	got, err := decodeLease("split.s", encode(l))
	require.NoError(t, err)
	assert.Equal(t, l, *got)

	ld := leaderVal{Schema: SchemaVersion, Owner: "w-1", Nonce: "abc", Generation: 3}
	gotL, err := decodeLeader(encode(ld))
	require.NoError(t, err)
	assert.Equal(t, ld, *gotL)

	w := workerVal{Schema: SchemaVersion, Nonce: "abc", MaxInFlight: 6}
	gotW, err := decodeWorker("worker.w-1", encode(w))
	require.NoError(t, err)
	assert.Equal(t, w, *gotW)

	for name, bad := range map[string]string{
		"owner not an instance id": `{"schema":1,"owner":"a.b","nonce":"n","epoch":1}`,
		"empty owner":              `{"schema":1,"owner":"","nonce":"n","epoch":1}`,
		"empty nonce":              `{"schema":1,"owner":"w","nonce":"","epoch":1}`,
		"other schema":             `{"schema":2,"owner":"w","nonce":"n","epoch":1}`,
		"unknown field":            `{"schema":1,"owner":"w","nonce":"n","epoch":1,"x":1}`,
	} {
		_, err := decodeLease("split.s", []byte(bad))
		assert.True(t, IsFatal(err), "lease %s: %v", name, err)
		if err != nil {
			assert.Contains(t, err.Error(), "split.s", "the error names the key")
		}
	}
	for name, bad := range map[string]string{
		"owner not an instance id": `{"schema":1,"owner":"a b","nonce":"n","generation":1}`,
		"empty nonce":              `{"schema":1,"owner":"w","nonce":"","generation":1}`,
		"trailing data":            `{"schema":1,"owner":"w","nonce":"n","generation":1}{}`,
	} {
		_, err := decodeLeader([]byte(bad))
		assert.True(t, IsFatal(err), "leader %s: %v", name, err)
	}
	_, err = decodeWorker("worker.w", []byte(`{"schema":1,"nonce":"n","max_in_flight":1,"x":2}`))
	assert.Error(t, err)
	assert.Contains(t, err.Error(), "worker.w")
}

func TestDurableRecordsRejectAlienShapes(t *testing.T) {
	spec := specRecord{Schema: SchemaVersion, ID: "s", FP: testFPHash, Weight: 2, Descriptor: []byte("d")}
	got, err := decodeSpec("spec.s", "s", encode(&spec), testFPHash)
	require.NoError(t, err)
	assert.Equal(t, spec, *got)

	noDesc := spec
	noDesc.Descriptor = nil
	_, err = decodeSpec("spec.s", "s", encode(&noDesc), testFPHash)
	assert.True(t, IsFatal(err), "a spec without a descriptor: %v", err)
	_, err = decodeSpec("spec.s", "t", encode(&spec), testFPHash)
	assert.True(t, IsFatal(err), "a spec whose id is not its key's: %v", err)
	_, err = decodeSpec("spec.s", "s", encode(&spec), testFPHash+1)
	assert.True(t, IsFatal(err), "a spec of another job: %v", err)
	assert.Contains(t, err.Error(), "two jobs share a namespace")

	p := planRecord{Schema: SchemaVersion, Fingerprint: testFP, Finality: finalityFinal, Planned: 3}
	gotP, err := decodePlan(keyPlan, encode(&p), testFP)
	require.NoError(t, err)
	assert.Equal(t, p, *gotP)
	p.Finality = "done"
	_, err = decodePlan(keyPlan, encode(&p), testFP)
	assert.True(t, IsFatal(err))
	assert.Contains(t, err.Error(), `finality "done"`)

	owner := rec("s", 1, "")
	owner.Owner = strPtr("not an id")
	_, err = decodeProgress("split.s", "s", encode(owner), testFPHash)
	assert.True(t, IsFatal(err), "a progress record whose owner is no instance id: %v", err)
}

// Every record this version writes decodes back to itself.
func TestRecordsRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		id := rapid.StringMatching(`[A-Za-z0-9_-]{1,16}`).Draw(t, "id")
		fp := rapid.Uint64().Draw(t, "fp")
		spec := specRecord{Schema: SchemaVersion, ID: id, FP: fp, Generation: rapid.Uint64().Draw(t, "gen"),
			Weight: rapid.Uint64().Draw(t, "weight"), Descriptor: rapid.SliceOf(rapid.Byte()).Draw(t, "desc")}
		got, err := decodeSpec(prefixSpec+id, id, encode(&spec), fp)
		require.NoError(t, err)
		require.Equal(t, encode(&spec), encode(got))

		a := assignmentVal{Schema: SchemaVersion, Generation: rapid.Uint64().Draw(t, "agen"),
			Splits: rapid.SliceOf(rapid.StringMatching(`[A-Za-z0-9_-]{1,8}`)).Draw(t, "splits")}
		if a.Splits == nil {
			a.Splits = []string{}
		}
		gotA, err := decodeAssignment(prefixAssign+"w", encode(&a))
		require.NoError(t, err)
		require.Equal(t, a, *gotA)

		p := planRecord{Schema: SchemaVersion, Fingerprint: "fp:" + id, Generation: rapid.Uint64().Draw(t, "pgen"),
			Finality: rapid.SampledFrom([]string{finalityOpen, finalityFinal}).Draw(t, "finality"),
			Planned:  rapid.Uint64().Draw(t, "planned"), UpdatedAtMs: rapid.Int64().Draw(t, "ts")}
		if rapid.Bool().Draw(t, "state") {
			st := rapid.SliceOf(rapid.Byte()).Draw(t, "plannerState")
			p.PlannerState = &st
		}
		gotP, err := decodePlan(keyPlan, encode(&p), p.Fingerprint)
		require.NoError(t, err)
		require.Equal(t, encode(&p), encode(gotP))
	})
}

func TestNewProgressRecordSeeds(t *testing.T) {
	r := newProgressRecord("s", 9, &SplitProgress{Watermark: 4, State: []byte("st")})
	assert.Equal(t, statusRunnable, r.Status)
	assert.Equal(t, int64(4), *r.Watermark)
	assert.Equal(t, []byte("st"), r.State)
	assert.Zero(t, r.Epoch)
	assert.Nil(t, r.Owner)
	assert.Equal(t, uint64(9), r.FP)
}
