package spate_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/spate-go/spate"
)

// Events print as the logs and the command show them: the kind, then
// what identifies it.
func TestEventStrings(t *testing.T) {
	id := spate.MustSplitID("s1")
	spec := spate.NewSplitSpec(id, []byte("d"))
	cases := []struct {
		ev   spate.Event
		want string
	}{
		{spate.Gained{Split: spec, Epoch: 3}, "Gained(s1 epoch=3)"},
		{spate.Gained{Split: spec, Epoch: 4, Progress: &spate.SplitProgress{Watermark: 10, Completed: true}},
			"Gained(s1 epoch=4 watermark=10 completed=true)"},
		{spate.Lost{Split: id}, "Lost(s1)"},
		{spate.RevokeRequested{Split: id}, "RevokeRequested(s1)"},
		{spate.Quarantined{Split: id, Attempts: 5}, "Quarantined(s1 attempts=5)"},
		{spate.PlanFinalized{Planned: 7}, "PlanFinalized(planned=7)"},
		{spate.AllComplete{}, "AllComplete"},
		{spate.Stalled{Completed: 6, Quarantined: 1}, "Stalled(completed=6 quarantined=1)"},
		{spate.Stalled{Completed: 6, Quarantined: 1, Damaged: []string{"s2"}}, "Stalled(completed=6 quarantined=1 damaged=[s2])"},
	}
	for _, c := range cases {
		s, ok := c.ev.(interface{ String() string })
		if assert.True(t, ok, "%T has no String", c.ev) {
			assert.Equal(t, c.want, s.String())
		}
	}
}
