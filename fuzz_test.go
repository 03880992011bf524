package spate

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Every decoder must turn any input into a value or a classified error, and
// never panic. A record that decodes must re-encode to something that
// decodes to the same record.

func FuzzDecodeProgress(f *testing.F) {
	fp := fingerprintHash("fuzz")
	f.Add(encode(newProgressRecord("s", fp, nil)))
	f.Add(encode(newProgressRecord("s", fp, &SplitProgress{Watermark: -5, State: []byte{0, 1}, Completed: true})))
	f.Add([]byte(`{"schema":1,"id":"s","fp":1,"epoch":18446744073709551615,"status":"runnable","owner":"x","attempts":1,"watermark":null,"state":null,"completed":false,"written_at_ms":0}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := decodeProgress("split.s", "s", data, fp)
		if err != nil {
			require.ErrorIs(t, err, ErrFatal, "unclassified error")
			return
		}
		again, err := decodeProgress("split.s", "s", encode(r), fp)
		require.NoError(t, err, "re-encoding does not round-trip")
		require.Equal(t, string(encode(r)), string(encode(again)), "re-encoding does not round-trip")
	})
}

func FuzzDecodePlan(f *testing.F) {
	f.Add(encode(&planRecord{Schema: 1, Fingerprint: "fuzz", Finality: "open"}))
	st := []byte("cursor")
	f.Add(encode(&planRecord{Schema: 1, Fingerprint: "fuzz", Finality: "final", Generation: 3, Planned: 9, PlannerState: &st}))
	f.Add([]byte(`{"schema":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := decodePlan("plan", data, "fuzz")
		if err != nil {
			require.ErrorIs(t, err, ErrFatal, "unclassified error")
			return
		}
		_, err = decodePlan("plan", encode(r), "fuzz")
		require.NoError(t, err, "re-encoding does not decode")
	})
}

func FuzzDecodeEphemeral(f *testing.F) {
	f.Add(encode(leaseVal{Schema: 1, Owner: "w", Nonce: "n", Epoch: 2}))
	f.Add(encode(leaderVal{Schema: 1, Owner: "w", Nonce: "n", Generation: 2}))
	f.Add(encode(workerVal{Schema: 1, Nonce: "n", MaxInFlight: 8}))
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, err := decodeLease("split.s", data); err != nil {
			require.ErrorIs(t, err, ErrFatal, "lease: unclassified error")
		}
		if _, err := decodeLeader(data); err != nil {
			require.ErrorIs(t, err, ErrFatal, "leader: unclassified error")
		}
		_, _ = decodeWorker("worker.w", data) // errors are logged, never fatal
	})
}

func FuzzDecodeAssignment(f *testing.F) {
	f.Add(encode(&assignmentVal{Schema: 1, Generation: 1, Splits: []string{"a", "b"}}))
	f.Add([]byte(`{"schema":1,"generation":1,"splits":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := decodeAssignment("assign.w", data)
		if err == nil {
			require.NotNil(t, a.Splits, "an assignment without splits must not decode as an empty one")
		}
	})
}

func FuzzSplitID(f *testing.F) {
	for _, s := range []string{"", "a", "a.b", "a b", "å", "rows-000-100", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := NewSplitID(s)
		if err != nil {
			require.Equal(t, kindFatal, kindOf(err), "invalid id %q: error %v is not Fatal", s, err)
			return
		}
		require.Equal(t, s, id.String(), "valid id %q does not make a valid key", s)
		require.NoError(t, ValidateKey(prefixSplit+s), "valid id %q does not make a valid key", s)
	})
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"lease_duration":"1.5s","op_timeout":"200ms","rebalance_delay":"none"}`))
	f.Add([]byte(`{"max_in_flight":-1}`))
	f.Add([]byte(`{"lease_duration":"-3h"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := parseConfig(data)
		if err != nil {
			require.ErrorIs(t, err, ErrFatal, "unclassified parse error")
			return
		}
		if err := c.Validate(); err != nil {
			require.ErrorIs(t, err, ErrFatal, "unclassified validation error")
		}
		again, err := parseConfig([]byte(c.String()))
		require.NoError(t, err, "config does not round-trip: %+v -> %+v", c, again)
		require.Equal(t, c, again, "config does not round-trip: %+v -> %+v", c, again)
	})
}
