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

// orderTB records the order in which StartCluster first uses the test's
// temporary directory and registers cleanups.
type orderTB struct {
	testing.TB
	events []string
}

func (o *orderTB) TempDir() string {
	o.events = append(o.events, "tempdir")
	return o.TB.TempDir()
}

func (o *orderTB) Cleanup(f func()) {
	o.events = append(o.events, "cleanup")
	o.TB.Cleanup(f)
}

// The cluster's shutdown must run before testing removes the test's
// temporary directory, which holds the nodes' stores: cleanups run
// last-registered first, and testing registers the removal at the
// directory's first use. A removal that ran first raced the still-running
// nodes' writes and failed a test now and then ("TempDir RemoveAll
// cleanup: … directory not empty").
func TestAClusterStopsBeforeItsStoresAreRemoved(t *testing.T) {
	o := &orderTB{TB: t}
	c := StartCluster(o, 3)
	require.NotEmpty(t, o.events)
	require.Equal(t, "tempdir", o.events[0], "the temporary directory is in use before any cleanup is registered: %v", o.events)
	require.Equal(t, "cleanup", o.events[1], "the cluster's shutdown is the first cleanup registered: %v", o.events)
	require.Len(t, c.Nodes, 3)
}
