package etcd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/spate-go/spate"
)

// startupCheck proves, within Options.StartupTimeout, that the cluster has
// quorum, that every member that answers runs a supported release, that the
// client's identity may read and write the prefix, and that TTL is not below
// the server's minimum lease TTL. It writes nothing that outlives it.
func (s *store) startupCheck(parent context.Context) error {
	ctx, cancel := context.WithTimeout(parent, s.opts.StartupTimeout)
	defer cancel()

	// A linearizable read needs a leader and a quorum, and read permission
	// on the whole prefix range.
	if _, err := s.cli.Get(ctx, s.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		return s.startupError(parent, ctx, "read the prefix", err)
	}
	if err := s.checkServerVersion(ctx); err != nil {
		return err
	}
	// A transaction whose condition can never hold (no key has a negative
	// create revision) writes nothing, but the server checks permission for
	// every operation of both branches: this proves readwrite on both
	// keyspaces without touching them.
	never := clientv3.Compare(clientv3.CreateRevision(s.prefix), "<", 0)
	_, err := s.cli.Txn(ctx).If(never).Then(
		clientv3.OpDelete(s.key(spate.Durable, ""), clientv3.WithPrefix()),
		clientv3.OpDelete(s.key(spate.Ephemeral, ""), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return s.startupError(parent, ctx, "check write permission on the prefix", err)
	}
	// The server raises every lease TTL to its minimum, so a one-second
	// grant reports that minimum.
	g, err := s.cli.Grant(ctx, 1)
	if err != nil {
		return s.startupError(parent, ctx, "grant a lease", err)
	}
	s.floor = time.Duration(g.TTL) * time.Second
	if _, err := s.cli.Revoke(ctx, g.ID); err != nil {
		s.log.Debug("etcd: could not revoke the startup lease; it expires on its own", "err", err)
	}
	if s.ttl < s.floor {
		return fmt.Errorf("etcd: TTL %v is below the server's minimum lease TTL of %v (1.5 election timeouts rounded up to whole seconds); raise TTL to at least %v: %w",
			s.ttl, s.floor, s.floor, spate.ErrFatal)
	}
	return nil
}

// startupError classifies a failed startup step. Server answers (wrong
// password, permission) classify directly. A step that timed out or found no
// connection is diagnosed: unreachable endpoints are Retryable, endpoints
// that accept TCP but with which gRPC cannot establish a session (a TLS or
// protocol mismatch) are Fatal.
func (s *store) startupError(parent, ctx context.Context, step string, err error) error {
	op := "startup check: " + step
	if parent.Err() != nil {
		return fmt.Errorf("etcd: %s: %w: %w", op, err, spate.ErrRetryable)
	}
	classified := fmt.Errorf("etcd: %s: %w", op, s.classify(parent, err))
	if spate.IsFatal(classified) {
		return classified
	}
	if ctx.Err() == nil && !isUnavailable(err) {
		return classified
	}
	return s.diagnose(parent, op, err)
}

func isUnavailable(err error) bool { return errCode(err) == codes.Unavailable }

// diagnoseTimeout bounds the diagnosis of a failed startup check.
const diagnoseTimeout = 3 * time.Second

// diagnose tells an unreachable cluster from one the client cannot talk to.
// It uses only structured signals: whether a plain TCP connection to each
// endpoint succeeds and, where it does, whether a fresh gRPC connection made
// with the client's own credentials becomes ready or fails its first
// attempt. gRPC's connection error is quoted for the operator, never matched.
func (s *store) diagnose(parent context.Context, op string, cause error) error {
	if conn := s.cli.ActiveConnection(); conn != nil && conn.GetState() == connectivity.Ready {
		return fmt.Errorf("etcd: %s: connected, but the cluster did not answer within %v (no leader or no quorum?): %w: %w",
			op, s.opts.StartupTimeout, cause, spate.ErrRetryable)
	}
	ctx, cancel := context.WithTimeout(parent, diagnoseTimeout)
	defer cancel()
	eps := s.cli.Endpoints()
	var dialErrs []error
	for _, ep := range eps {
		network, addr := dialTarget(ep)
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			dialErrs = append(dialErrs, err)
			continue
		}
		_ = c.Close()
		switch ok, detail := s.tryConnect(ctx, ep); {
		case ok:
			return fmt.Errorf("etcd: %s: endpoint %s is reachable now but the check did not complete in time; retry: %w: %w",
				op, ep, cause, spate.ErrRetryable)
		case detail != "":
			return fmt.Errorf("etcd: %s: endpoint %s accepts TCP connections but no gRPC session can be established with the client's "+
				"credentials, so the TLS handshake or the protocol does not match: check the etcd client's TLS config (the CA that signed "+
				"the server's certificate, a client certificate and key the server trusts, the server name) and the endpoint scheme "+
				"(https:// for a TLS listener); gRPC reports: %s: %w: %w",
				op, ep, detail, cause, spate.ErrFatal)
		}
	}
	if len(dialErrs) == len(eps) {
		return fmt.Errorf("etcd: %s: no endpoint of %v accepts connections (%w); is etcd running there? (%w): %w",
			op, eps, errors.Join(dialErrs...), cause, spate.ErrRetryable)
	}
	return fmt.Errorf("etcd: %s: endpoints %v accept TCP connections but the gRPC session is still being established: %w: %w",
		op, eps, cause, spate.ErrRetryable)
}

// tryConnect makes one fresh gRPC connection to ep with the client's
// credentials and follows its first attempt: ok if it becomes ready; a
// non-empty detail (gRPC's reason) if the attempt fails; neither if it is
// still undecided when ctx ends.
func (s *store) tryConnect(ctx context.Context, ep string) (ok bool, detail string) {
	conn, err := s.cli.Dial(ep)
	if err != nil {
		return false, ""
	}
	defer conn.Close()
	conn.Connect()
	for {
		switch st := conn.GetState(); st {
		case connectivity.Ready:
			return true, ""
		case connectivity.TransientFailure:
			return false, lastConnError(ctx, conn)
		case connectivity.Shutdown:
			return false, ""
		default:
			if !conn.WaitForStateChange(ctx, st) {
				return false, ""
			}
		}
	}
}

// lastConnError asks gRPC, without waiting for a connection, why it has none.
func lastConnError(ctx context.Context, conn *grpc.ClientConn) string {
	_, err := pb.NewMaintenanceClient(conn).Status(ctx, &pb.StatusRequest{}, grpc.WaitForReady(false))
	if err == nil {
		return "no error (the connection recovered)"
	}
	if st, ok := status.FromError(err); ok {
		return st.Message()
	}
	return err.Error()
}

// dialTarget parses a clientv3 endpoint: "host:port", "http(s)://host:port",
// "unix(s)://path" or "unix(s):path".
func dialTarget(ep string) (network, addr string) {
	if scheme, rest, ok := strings.Cut(ep, "://"); ok {
		if scheme == "unix" || scheme == "unixs" {
			return "unix", rest
		}
		host, _, _ := strings.Cut(rest, "/")
		return "tcp", host
	}
	for _, p := range []string{"unixs:", "unix:"} {
		if path, ok := strings.CutPrefix(ep, p); ok {
			return "unix", path
		}
	}
	return "tcp", ep
}
