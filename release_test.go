package spate

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReleaseClearsTheOwnerKeepsTheEpochAndDeparts(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 2, nil)
	holdSplit(t, a, st, "t", 7, nil)
	require.NoError(t, send(t, a, &command{kind: cmdRelease, splits: []SplitID{MustSplitID("s")}}))
	settleIO(t, a)
	r, _ := storedProgress(t, st, "s")
	assert.Nil(t, r.Owner)
	assert.Equal(t, uint64(2), r.Epoch)
	assert.Zero(t, r.Attempts)
	assert.False(t, a.worker.parting, "a worker still holding splits has not departed")
	assert.Equal(t, 1.0, testutil.ToFloat64(a.m.releases))

	require.NoError(t, send(t, a, &command{kind: cmdRelease, splits: []SplitID{MustSplitID("t"), MustSplitID("unheld")}}))
	settleIO(t, a)
	assert.True(t, a.worker.parting, "releasing the last held split is a departure")
	assert.Empty(t, a.worker.owned)
	assert.Empty(t, a.worker.handingBack)
	assert.Zero(t, a.worker.undrained)
}

func TestDrainedReleaseIsNeverADeparture(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 2, nil)
	require.True(t, a.worker.revocations.begin("s", a.worker.owned["s"], a.renew.leases["s"].lastOK))
	require.NoError(t, send(t, a, &command{kind: cmdReleaseDrained, splits: []SplitID{MustSplitID("s")}}))
	settleIO(t, a)
	assert.False(t, a.worker.parting)
	assert.Empty(t, a.worker.revocations.byID)
	assert.Equal(t, 1.0, testutil.ToFloat64(a.m.revocations.WithLabelValues("drained")))
}

func TestReleaseWhoseRecordMovedIsFenced(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	holdSplit(t, a, st, "s", 2, nil)
	holdSplit(t, a, st, "t", 2, nil)
	st.put(Durable, prefixSplit+"s", encode(rec("s", 3, "peer")))
	require.NoError(t, send(t, a, &command{kind: cmdRelease, splits: []SplitID{MustSplitID("s")}}))
	assert.Equal(t, []string{"s"}, lostSplits(events(t, a)))
	r, _ := storedProgress(t, st, "s")
	assert.Equal(t, "peer", r.owner())
	assert.Zero(t, testutil.ToFloat64(a.m.releases))
}
