package spate

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The trigger's threshold (docs/decisions/043): with a lane idle and
// nothing unplaced, a running split whose expected remaining time is more
// than one of its commit intervals is asked for, so the fleet's last
// worker finishes within about one commit interval of the others; one
// that expects less than a commit interval is left alone. A threshold of
// two intervals left a 1.1-interval remainder on one worker while the
// others idled (a finish spread of up to 1.5 s at backfill's 1 s commit
// interval with --min-splits 1).
func TestTheTriggerAsksForARemainderOfMoreThanOneCommitInterval(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after uint64 // what is left one commit interval (1 s) after 3000
		asked bool
	}{
		// 1400 units/s: 1600 left is 1.14 s.
		{"1.14 intervals left", 1600, true},
		// 1600 units/s: 1400 left is 0.875 s.
		{"0.875 intervals left", 1400, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newTestActor(t, newFakeStore(), testConfig())
			a.leader.term = &leadership{generation: 1}
			a.members.presence["owner"] = presenceEntry{rev: 1}
			a.members.presence["idle"] = presenceEntry{rev: 2}
			owner := "owner"
			v := &splitView{spec: &specRecord{Schema: SchemaVersion, ID: "s", Weight: 3000},
				lease: &leaseVal{Schema: SchemaVersion, Owner: owner, Epoch: 1},
				prog: &progressRecord{Schema: SchemaVersion, ID: "s", Epoch: 1, Status: statusRunnable, Owner: &owner,
					Remaining: 3000, WrittenAtMs: 10_000}}
			a.job.splits["s"] = v
			now := time.Now()
			a.askDivisions(now) // the trigger's state starts with the leader's term
			a.leader.div.idle, a.leader.div.unplaced = 1, 0
			a.askDivisions(now) // the first record: no rate yet
			require.Empty(t, a.leader.div.asked)
			next := *v.prog
			next.Remaining, next.WrittenAtMs = tc.after, 11_000
			v.prog = &next
			a.askDivisions(now.Add(time.Second))
			if tc.asked {
				assert.Contains(t, a.leader.div.asked, "s", "a remainder of more than one commit interval is divided")
			} else {
				assert.Empty(t, a.leader.div.asked, "a remainder of less than one commit interval is not worth a division")
			}
		})
	}
}
