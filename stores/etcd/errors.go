package etcd

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/spate-go/spate"
)

// fatalHints tell the operator what to fix for the server errors that no
// retry can cure. Matching is by errors.Is against etcd's typed errors
// (clientv3 converts the server's status into them).
var fatalHints = []struct {
	err  error
	hint string
}{
	{rpctypes.ErrAuthFailed, "authentication failed: the client's user name or password is wrong; fix the credentials in the etcd client config"},
	{rpctypes.ErrInvalidAuthToken, "the auth token was rejected and could not be renewed; check the client's credentials"},
	{rpctypes.ErrUserEmpty, "the server requires authentication but the client sent no user; set Username and Password (or a client certificate whose CN is a user) in the etcd client config"},
	{rpctypes.ErrUserNotFound, "the client's user does not exist on the server; create it or fix the user name"},
	{rpctypes.ErrPermissionDenied, "permission denied: the client's user lacks readwrite permission on the store's prefix; grant its role readwrite on the prefix range (etcdctl role grant-permission ROLE readwrite PREFIX --prefix)"},
	{rpctypes.ErrRoleNotGranted, "the client's user has no role; grant it a role with readwrite on the store's prefix"},
	{rpctypes.ErrPermissionNotGranted, "the client's role has no permission on the store's prefix; grant it readwrite"},
	{rpctypes.ErrNoSpace, "the cluster raised its NOSPACE alarm (database over --quota-backend-bytes); compact, defragment, raise the quota and disarm the alarm (etcdctl alarm disarm)"},
	{rpctypes.ErrCorrupt, "the cluster reports data corruption; restore the cluster from a snapshot"},
	{rpctypes.ErrTooManyOps, "the server's --max-txn-ops is below 2; raise it (default 128)"},
	{rpctypes.ErrLeaseTTLTooLarge, "the TTL exceeds the server's maximum lease TTL; lower TTL"},
}

// retryableServerErrs are server conditions that pass: lost leader,
// timeouts, overload, compaction, a lease that expired between its grant
// and its use, an auth store that moved on.
var retryableServerErrs = []error{
	rpctypes.ErrNoLeader, rpctypes.ErrLeaderChanged, rpctypes.ErrNotLeader, rpctypes.ErrStopped,
	rpctypes.ErrTimeout, rpctypes.ErrTimeoutDueToLeaderFail, rpctypes.ErrTimeoutDueToConnectionLost,
	rpctypes.ErrTimeoutWaitAppliedIndex, rpctypes.ErrUnhealthy, rpctypes.ErrTooManyRequests,
	rpctypes.ErrCompacted, rpctypes.ErrFutureRev, rpctypes.ErrLeaseNotFound, rpctypes.ErrAuthOldRevision,
}

// classify adds its spate class to err from an etcd call of the store's
// (the portable layer names the driver, the operation and the key). ctx is
// the call's context; the client's own context tells a client closed by its
// owner (Fatal: nothing will ever succeed on it) from a cancelled call.
func (s *store) classify(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if s.cli.Ctx().Err() != nil {
		return fmt.Errorf("the etcd client was closed by its owner while the store is open: %w: %w", err, spate.ErrFatal)
	}
	if ctx.Err() == nil && errors.Is(err, rpctypes.ErrRequestTooLarge) {
		return fmt.Errorf("the server rejected the request as too large; MaxValueSize (%d) must stay below the server's --max-request-bytes minus %d bytes: %w: %w: %w",
			s.maxValue, requestOverhead, err, spate.ErrValueTooLarge, spate.ErrFatal)
	}
	return classifyErr(ctx, err)
}

// classifyCall wraps err from an etcd call described by what with its
// spate class, for calls outside the six primitives.
func classifyCall(ctx context.Context, what string, err error) error {
	return fmt.Errorf("etcd: %s: %w", what, classifyErr(ctx, err))
}

// classifyErr adds its spate class to err from an etcd call: a done ctx
// and transport trouble are Retryable, server answers that no retry cures
// Fatal (with what to fix).
func classifyErr(ctx context.Context, err error) error {
	if ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", err, spate.ErrRetryable)
	}
	for _, h := range fatalHints {
		if errors.Is(err, h.err) {
			return fmt.Errorf("%s: %w: %w", h.hint, err, spate.ErrFatal)
		}
	}
	for _, r := range retryableServerErrs {
		if errors.Is(err, r) {
			return fmt.Errorf("%w: %w", err, spate.ErrRetryable)
		}
	}
	if isFatalCode(errCode(err)) {
		return fmt.Errorf("%w: %w", err, spate.ErrFatal)
	}
	// Unavailable, DeadlineExceeded, Canceled, ResourceExhausted, Aborted,
	// Internal, Unknown and errors without a status: transport trouble or a
	// server condition nobody classified. Every write is conditional, so a
	// retry after a re-read is safe.
	return fmt.Errorf("%w: %w", err, spate.ErrRetryable)
}

// errCode is the gRPC code of err, from etcd's typed error or a gRPC status.
func errCode(err error) codes.Code {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code()
	}
	if st, ok := status.FromError(err); ok {
		return st.Code()
	}
	return codes.Unknown
}

// isFatalCode: codes that mean the request itself, or the client's
// identity, is wrong.
func isFatalCode(c codes.Code) bool {
	switch c {
	case codes.Unauthenticated, codes.PermissionDenied, codes.InvalidArgument,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unimplemented,
		codes.NotFound, codes.AlreadyExists, codes.DataLoss:
		return true
	}
	return false
}
