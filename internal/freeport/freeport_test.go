package freeport

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPortsAreDistinctAndBindable(t *testing.T) {
	ps, err := Ports(4)
	require.NoError(t, err)
	seen := map[int]bool{}
	for _, p := range ps {
		require.False(t, seen[p], "port %d returned twice in %v", p, ps)
		seen[p] = true
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		require.NoError(t, err, "port %d is not bindable after Ports returned", p)
		_ = l.Close()
	}
}

func TestWithOffsetLeavesBothFree(t *testing.T) {
	p := WithOffset(t, 10)
	for _, q := range []int{p, p + 10} {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(q))
		require.NoError(t, err, "port %d", q)
		_ = l.Close()
	}
}

// Where the kernel's ephemeral range is known, the ports come from below
// it, where no outgoing connection and no listener on port 0 is placed.
func TestPortsComeFromBelowTheEphemeralRange(t *testing.T) {
	lo, hi := belowEphemeral()
	if hi <= lo {
		t.Skip("the kernel's ephemeral port range is unknown here")
	}
	ps, err := Ports(8)
	require.NoError(t, err)
	for _, p := range ps {
		assert.GreaterOrEqual(t, p, lo)
		assert.Less(t, p, hi, "port %d is inside the ephemeral range", p)
	}
}
