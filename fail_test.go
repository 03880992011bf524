package spate

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFailConsumesAnAttemptAndHandsTheSplitBack(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 2, nil)
	require.NoError(t, send(t, a, &command{kind: cmdFail, split: MustSplitID("s"), reason: "poison"}))
	settleIO(t, a)
	r, _ := storedProgress(t, st, "s")
	assert.Equal(t, uint32(1), r.Attempts)
	assert.Nil(t, r.Owner)
	assert.Equal(t, uint64(2), r.Epoch, "below the cap the epoch stays")
	assert.Equal(t, statusRunnable, r.Status)
	assert.NotContains(t, a.worker.owned, "s")
	_, ok := st.entry(Ephemeral, prefixSplit+"s")
	assert.False(t, ok, "the lease is dropped")
	assert.Empty(t, lostSplits(events(t, a)), "the source asked for it: no Lost")
}

func TestFailAtTheCapQuarantinesAndFencesZombies(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	r := rec("s", 2, "me")
	r.Attempts = uint32(a.cfg.MaxAttempts - 1)
	holdSplit(t, a, st, "s", 2, r)
	require.NoError(t, send(t, a, &command{kind: cmdFail, split: MustSplitID("s"), reason: "poison"}))
	got, _ := storedProgress(t, st, "s")
	assert.Equal(t, statusQuarant, got.Status)
	assert.Equal(t, uint64(3), got.Epoch, "quarantine bumps the epoch")
	assert.Equal(t, 1, a.job.nQuarant)
	assert.Equal(t, 1.0, testutil.ToFloat64(a.m.quarantines))
	var quarantined []Quarantined
	for _, e := range events(t, a) {
		if q, ok := e.(Quarantined); ok {
			quarantined = append(quarantined, q)
		}
	}
	assert.Equal(t, []Quarantined{{Split: MustSplitID("s"), Attempts: uint32(a.cfg.MaxAttempts)}}, quarantined)
	assert.Equal(t, "poison", got.LastFailure, "the record keeps why the split was set aside")
}

// A recorded failure reason is bounded and valid UTF-8, whatever the
// source passed; a death without progress records its own.
func TestFailureReasonsAreBoundedAndNamed(t *testing.T) {
	long := strings.Repeat("é", 400) + "\xff<script>"
	got := failureText(long)
	assert.LessOrEqual(t, len(got), maxFailureLen)
	assert.True(t, utf8.ValidString(got))
	assert.True(t, strings.HasSuffix(got, "…"))
	assert.Equal(t, "bad \uFFFD?", failureText("bad \uFFFD\xff"))
	assert.Contains(t, deathText("w-2", 7), "w-2 at epoch 7")

	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 2, nil)
	require.NoError(t, send(t, a, &command{kind: cmdFail, split: MustSplitID("s"), reason: long}))
	r, _ := storedProgress(t, st, "s")
	assert.Equal(t, got, r.LastFailure)
	assert.Equal(t, uint32(1), r.Attempts)
}

func TestFailLosingItsCASIsFenced(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 2, nil)
	st.put(Durable, prefixSplit+"s", encode(rec("s", 3, "peer")))
	err := send(t, a, &command{kind: cmdFail, split: MustSplitID("s")})
	assert.True(t, IsFenced(err), "got %v", err)
	assert.Equal(t, []string{"s"}, lostSplits(events(t, a)))
	got, _ := storedProgress(t, st, "s")
	assert.Zero(t, got.Attempts, "nothing was written")
}
