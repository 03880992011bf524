package etcd

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// DialOptions are gRPC options for the clientv3.Config of a client spate
// uses (clientv3.Config.DialOptions). gRPC's default reconnect backoff grows
// to two minutes: after a server restart, a client whose early reconnects
// failed can stay disconnected for many seconds after the server is back,
// and every lease it holds starves meanwhile. These options reconnect
// within about a second of the server's return.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
		MinConnectTimeout: time.Second,
	})}
}
