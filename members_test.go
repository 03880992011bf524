package spate

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestExpireDeparted(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const delay = 20 * time.Second
	cases := []struct {
		name      string
		departed  map[string]time.Time
		delay     time.Duration
		now       time.Time
		want      bool
		remaining []string
	}{
		{"nothing departed", map[string]time.Time{}, delay, t0, false, nil},
		{"inside the window", map[string]time.Time{"a": t0}, delay, t0.Add(delay - time.Nanosecond), false, []string{"a"}},
		{"at the deadline", map[string]time.Time{"a": t0}, delay, t0.Add(delay), true, nil},
		{"one over, one not", map[string]time.Time{"a": t0, "b": t0.Add(10 * time.Second)}, delay, t0.Add(25 * time.Second), true, []string{"b"}},
		{"NoRebalanceDelay ends every window at once", map[string]time.Time{"a": t0, "b": t0.Add(time.Hour)}, NoRebalanceDelay, t0, true, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := expireDeparted(c.departed, c.delay, c.now)
			assert.Equal(t, c.want, got)
			var rest []string
			for k := range c.departed {
				rest = append(rest, k)
			}
			assert.ElementsMatch(t, c.remaining, rest)
		})
	}
}

// The membership log runs when the presence set changes, not on every step.
func TestMembershipIsLoggedOnlyWhenPresenceChanges(t *testing.T) {
	a := newTestActor(t, nil, testConfig())
	a.members.joinLogged = true
	require.NoError(t, a.ephemeralPut(prefixWorker+"peer", workerBytes("n-peer", 4), 5))
	require.True(t, a.members.dirty)
	a.members.logMembership(a.log, a.self)
	assert.True(t, a.members.loggedPeers["peer"])
	assert.False(t, a.members.dirty)

	require.NoError(t, a.ephemeralPut(prefixWorker+"peer", workerBytes("n-peer", 4), 6))
	assert.False(t, a.members.dirty, "a presence heartbeat is no membership change")
	a.ephemeralDelete(prefixWorker+"peer", 7, false)
	assert.True(t, a.members.dirty)
	a.members.logMembership(a.log, a.self)
	assert.False(t, a.members.loggedPeers["peer"])
}
