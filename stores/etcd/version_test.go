package etcd_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/etcd"
)

// oldEtcd answers like an etcd server of another release: reads succeed
// (empty), Status reports version, and every write is counted — the driver
// must refuse the server before it writes or grants anything.
type oldEtcd struct {
	pb.UnimplementedKVServer
	pb.UnimplementedMaintenanceServer
	pb.UnimplementedLeaseServer
	version string
	writes  chan string
}

func (f *oldEtcd) Range(context.Context, *pb.RangeRequest) (*pb.RangeResponse, error) {
	return &pb.RangeResponse{Header: &pb.ResponseHeader{ClusterId: 1, MemberId: 1, Revision: 1}}, nil
}

func (f *oldEtcd) Txn(context.Context, *pb.TxnRequest) (*pb.TxnResponse, error) {
	f.writes <- "txn"
	return &pb.TxnResponse{Header: &pb.ResponseHeader{Revision: 1}}, nil
}

func (f *oldEtcd) LeaseGrant(context.Context, *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error) {
	f.writes <- "lease grant"
	return &pb.LeaseGrantResponse{Header: &pb.ResponseHeader{Revision: 1}, ID: 1, TTL: 1}, nil
}

func (f *oldEtcd) Status(context.Context, *pb.StatusRequest) (*pb.StatusResponse, error) {
	return &pb.StatusResponse{Header: &pb.ResponseHeader{ClusterId: 1, MemberId: 1, Revision: 1}, Version: f.version, Leader: 1}, nil
}

func startFakeEtcd(t *testing.T, version string) (*clientv3.Client, *oldEtcd) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &oldEtcd{version: version, writes: make(chan string, 16)}
	srv := grpc.NewServer()
	pb.RegisterKVServer(srv, f)
	pb.RegisterMaintenanceServer(srv, f)
	pb.RegisterLeaseServer(srv, f)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + ln.Addr().String()}, DialTimeout: 2 * time.Second, Logger: nopLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cli.Close() })
	return cli, f
}

func TestOldServerVersionIsFatal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ version, want string }{
		{"3.4.27", "runs etcd 3.4.27; the driver needs " + etcd.MinServerVersion + " or newer: upgrade the cluster"},
		{"not-a-version", `reports server version "not-a-version", which is not a release number`},
	} {
		t.Run(tc.version, func(t *testing.T) {
			t.Parallel()
			cli, f := startFakeEtcd(t, tc.version)
			_, err := etcd.New(t.Context(), cli, etcd.Options{Prefix: "/spate/old/", TTL: 5 * time.Second, StartupTimeout: 5 * time.Second})
			require.True(t, spate.IsFatal(err), "New against etcd %q: %v\nwant a Fatal error", tc.version, err)
			require.ErrorContains(t, err, tc.want, "New against etcd %q", tc.version)
			select {
			case w := <-f.writes:
				t.Fatalf("the driver sent a %s to a server it refuses", w)
			default:
			}
			t.Logf("error: %v", err)
		})
	}
}

// A supported release passes the version check (the fake then serves the
// rest of the startup check), so the test above fails for the version alone.
func TestSupportedServerVersionPasses(t *testing.T) {
	t.Parallel()
	cli, _ := startFakeEtcd(t, "3.5.21")
	s, err := etcd.New(t.Context(), cli, etcd.Options{Prefix: "/spate/ok/", TTL: 5 * time.Second, StartupTimeout: 5 * time.Second})
	require.NoError(t, err, "New against a fake etcd 3.5.21")
	_ = s.Close()
}
