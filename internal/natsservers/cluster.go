package natsservers

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/spate-go/spate/internal/freeport"
)

// Cluster is a JetStream cluster of in-process servers on loopback.
type Cluster struct {
	Nodes []*Server
}

// StartCluster runs n clustered servers with JetStream and waits for a
// JetStream meta leader. Options apply to every node (authentication and TLS
// are for single servers only). The cluster shuts down at cleanup.
func StartCluster(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	c := &Cluster{}
	// The test's temporary directory must exist before the shutdown is
	// registered: testing removes it in a cleanup registered at its first
	// use, and cleanups run last-registered first. Created later (by the
	// nodes' store directories), it would be removed while the nodes still
	// run, and a node writing its raft state meanwhile fails the removal
	// ("directory not empty").
	_ = t.TempDir()
	t.Cleanup(func() { c.Shutdown() })
	var err error
	for range clusterAttempts {
		if c.Nodes, err = startNodes(t, n, opts); err == nil {
			c.WaitMetaLeader(t)
			return c
		}
		var busy *errListen
		if !errors.As(err, &busy) {
			break
		}
		t.Logf("natsservers: %v; starting the cluster again on fresh ports", err)
	}
	t.Fatalf("natsservers: cluster: %v", err)
	return nil
}

// clusterAttempts bounds how often [StartCluster] starts a cluster again
// because a port it found free was taken before its server bound it.
const clusterAttempts = 5

// startNodes starts n clustered nodes on fresh ports. On any failure it
// shuts down the nodes it started and returns the error.
func startNodes(t testing.TB, n int, opts []Option) ([]*Server, error) {
	t.Helper()
	ports, err := freeport.Ports(2 * n)
	if err != nil {
		return nil, err
	}
	var routes []*url.URL
	for i := range n {
		routes = append(routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", ports[n+i])})
	}
	var nodes []*Server
	for i := range n {
		s := newServer(t, fmt.Sprintf("n%d", i), opts)
		if s.cfg.tls || s.cfg.creds || s.cfg.nkey || s.cfg.user != "" || s.cfg.token != "" {
			t.Fatalf("natsservers: clusters run without authentication or TLS")
		}
		s.port = ports[i]
		s.clusterName = "natstest"
		s.clusterPort = ports[n+i]
		s.routes = routes
		nodes = append(nodes, s)
	}
	for _, s := range nodes {
		if err := s.tryStart(); err != nil {
			for _, started := range nodes {
				started.Shutdown()
			}
			return nil, err
		}
	}
	return nodes, nil
}

// settleWait bounds how long [Cluster.Shutdown] waits for the nodes to
// settle before it stops them.
const settleWait = 15 * time.Second

// Shutdown stops every node. It first waits, up to settleWait, until every
// running node reports itself healthy (the meta layer and each stream
// assigned to it current). A node restarted mid-test may still be creating
// the streams assigned to it; a stream created after its server's shutdown
// began is never stopped, and its file store's goroutines outlive the
// server (what the package's leak check reports).
func (c *Cluster) Shutdown() {
	deadline := time.Now().Add(settleWait)
	for _, s := range c.Nodes {
		srv := s.Raw()
		for srv != nil && time.Now().Before(deadline) {
			if srv.Healthz(&server.HealthzOptions{}).StatusCode == 200 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, s := range c.Nodes {
		s.Shutdown()
	}
}

// URLs is the comma-separated client URL list of every node.
func (c *Cluster) URLs() string {
	urls := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		urls[i] = s.URL
	}
	return strings.Join(urls, ",")
}

// Connect opens a client connection that knows every node and reconnects
// forever, and closes it at cleanup.
func (c *Cluster) Connect(t testing.TB, extra ...natsgo.Option) *natsgo.Conn {
	t.Helper()
	nc, err := natsgo.Connect(c.URLs(), c.Nodes[0].clientOptions(extra)...)
	if err != nil {
		t.Fatalf("natsservers: connect to the cluster: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// WaitMetaLeader waits until the running nodes are fully routed to each
// other and have a JetStream meta leader that sees every running node
// online with JetStream (so that it can place replicated streams) and
// every running node is current with it.
//
// The route check is a precaution: the meta group's traffic could flow
// while a pooled route that carries client accounts is still being made,
// and until then a client's publish through one node to a stream led on
// another would find no responders. In five probe runs every route was
// already up when the meta leader was, so it has not been seen to matter.
func (c *Cluster) WaitMetaLeader(t testing.TB) {
	t.Helper()
	Eventually(t, 30*time.Second, "every node routed to every other and a JetStream meta leader with every node online", func() bool {
		var up []*server.Server
		for _, s := range c.Nodes {
			if srv := s.Raw(); srv != nil {
				up = append(up, srv)
			}
		}
		online, current := 0, true
		for _, srv := range up {
			if srv.NumRemotes() != len(up)-1 || srv.NumRoutes() < (len(up)-1)*server.DEFAULT_ROUTE_POOL_SIZE {
				return false
			}
			if srv.JetStreamIsLeader() {
				online = len(srv.JetStreamClusterPeers())
			}
			current = current && srv.JetStreamIsCurrent()
		}
		return online == len(up) && current
	})
}

// StreamLeader returns the index of the node leading stream, asking over nc.
func (c *Cluster) StreamLeader(t testing.TB, nc *natsgo.Conn, stream string) int {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natsservers: jetstream: %v", err)
	}
	idx := -1
	Eventually(t, 30*time.Second, "stream "+stream+" leader", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, stream)
		if err != nil {
			return false
		}
		info := st.CachedInfo()
		if info.Cluster == nil {
			return false
		}
		for i, s := range c.Nodes {
			if s.Name() == info.Cluster.Leader {
				idx = i
				return true
			}
		}
		return false
	})
	return idx
}

// WaitStreamReplicasCurrent waits until stream has a leader and every
// replica reports current, so that stopping any one node cannot stall it.
func (c *Cluster) WaitStreamReplicasCurrent(t testing.TB, nc *natsgo.Conn, stream string, replicas int) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natsservers: jetstream: %v", err)
	}
	Eventually(t, 30*time.Second, "stream "+stream+" replicas current", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, stream)
		if err != nil {
			return false
		}
		cl := st.CachedInfo().Cluster
		if cl == nil || cl.Leader == "" || len(cl.Replicas) != replicas-1 {
			return false
		}
		for _, r := range cl.Replicas {
			if !r.Current || r.Offline {
				return false
			}
		}
		return true
	})
}
