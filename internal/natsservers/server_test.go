package natsservers

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// A server whose port another process holds fails its start at once, with
// the error StartCluster retries on (a start that waited out readyWait
// would fail with another).
func TestAServerOnATakenPortFailsItsStartAtOnce(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	s := newServer(t, "taken", nil)
	s.port = l.Addr().(*net.TCPAddr).Port
	err = s.tryStart()
	var busy *errListen
	require.ErrorAs(t, err, &busy)
	require.Contains(t, err.Error(), "listening on")
	require.False(t, s.Running())
}

func TestAClusterStartsAndStops(t *testing.T) {
	c := StartCluster(t, 3)
	require.Len(t, c.Nodes, 3)
	for _, n := range c.Nodes {
		require.True(t, n.Running(), n.Name())
	}
	c.Shutdown()
	for _, n := range c.Nodes {
		require.False(t, n.Running(), n.Name())
	}
}
