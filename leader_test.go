package spate

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ----- assignInput ---------------------------------------------------------------

// ----- publish and election on the loop ---------------------------------------------

// An election that wins the leader key fences the plan generation past
// its predecessor's and hands the key to the renewer.
func TestElectionBumpsTheGenerationAndLeads(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	p := &planRecord{Schema: SchemaVersion, Fingerprint: testFP, Finality: finalityOpen, Generation: 4}
	a.planning.plan, a.planning.planRev = p, st.put(Durable, keyPlan, encode(p))
	a.assigns.byInst["peer"] = assigned(4, "s")
	a.elect(time.Now())
	settleIO(t, a)
	require.NotNil(t, a.leader.term)
	assert.Equal(t, uint64(5), a.leader.term.generation)
	assert.Equal(t, uint64(5), a.planning.plan.Generation)
	stored, err := decodePlan(keyPlan, func() []byte { e, _ := st.entry(Durable, keyPlan); return e.Value }(), testFP)
	require.NoError(t, err)
	assert.Equal(t, uint64(5), stored.Generation)
	e, ok := st.entry(Ephemeral, keyLeader)
	require.True(t, ok)
	assert.Equal(t, e.Revision, a.renew.leaderRev(), "the renewer keeps the won leader key alive")
	assert.True(t, a.planning.due, "an open plan is re-run by a new leader")
	assert.True(t, a.leader.term.settleUntil.IsZero(), "a job with assignments already is no new job: no settle window")
}

// A racing successor that already fenced a higher generation makes the
// winner of the leader key give it up again at once.
func TestElectionGivesUpWhenASuccessorHoldsTheGeneration(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	p := &planRecord{Schema: SchemaVersion, Fingerprint: testFP, Finality: finalityOpen, Generation: 1}
	a.planning.plan, a.planning.planRev = p, st.put(Durable, keyPlan, encode(p))
	successor := *p
	successor.Generation = 2
	st.put(Durable, keyPlan, encode(&successor)) // lands after the snapshot the election starts from
	a.elect(time.Now())
	settleIO(t, a)
	assert.Nil(t, a.leader.term)
	assert.Equal(t, uint64(2), a.planning.plan.Generation, "the election folds the plan it read")
	_, ok := st.entry(Ephemeral, keyLeader)
	assert.False(t, ok, "the won leader key is deleted again")
	assert.False(t, a.io.due(opKey{op: "elect"}, time.Now()), "a failed election backs off")
}
