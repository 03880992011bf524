package redis

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"

	"github.com/spate-go/spate"
)

// serverError stands for a server error reply: go-redis marks those with a
// RedisError method, which is all classOf looks at.
type serverError string

func (e serverError) Error() string { return string(e) }
func (serverError) RedisError()     {}

var _ goredis.Error = serverError("")

func TestClassOf(t *testing.T) {
	retryable := []error{
		context.Canceled,
		context.DeadlineExceeded,
		io.EOF,
		io.ErrUnexpectedEOF,
		&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED},
		&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET},
		goredis.ErrPoolTimeout,
		serverError("LOADING Redis is loading the dataset in memory"),
		serverError("TRYAGAIN Multiple keys request during rehashing of slot"),
		serverError("CLUSTERDOWN The cluster is down"),
		serverError("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
		serverError("READONLY You can't write against a read only replica."),
		serverError("BUSY Redis is busy running a script."),
		serverError("NOREPLICAS Not enough good replicas to write."),
		serverError("OOM command not allowed when used memory > 'maxmemory'."),
		serverError("ERR max number of clients reached"),
		fmt.Errorf("wrapped: %w", serverError("LOADING loading")),
	}
	fatal := []error{
		goredis.ErrClosed,
		serverError("NOAUTH Authentication required."),
		serverError("WRONGPASS invalid username-password pair or user is disabled."),
		serverError("NOPERM this user has no permissions to run the 'evalsha' command"),
		serverError("ERR unknown command 'eval'"),
		serverError("NOSCRIPT No matching script. Please use EVAL."),
		serverError("WRONGTYPE Operation against a key holding the wrong kind of value"),
		serverError("ERR The user executing the script can't run this command or subcommand script: x, on @user_script:1."),
		serverError("CROSSSLOT Keys in request don't hash to the same slot"),
		x509.UnknownAuthorityError{},
		fmt.Errorf("tls: %w", x509.HostnameError{Host: "x"}),
	}
	for _, err := range retryable {
		assert.Same(t, spate.ErrRetryable, classOf(err), "classOf(%v), want Retryable", err)
		w := wrapErr(err)
		assert.True(t, spate.IsRetryable(w), "wrapErr(%v) = %v: want Retryable", err, w)
		assert.ErrorIs(t, w, err, "wrapErr(%v) = %v: want the cause kept", err, w)
	}
	for _, err := range fatal {
		assert.Same(t, spate.ErrFatal, classOf(err), "classOf(%v), want Fatal", err)
		w := wrapErr(err)
		assert.True(t, spate.IsFatal(w), "wrapErr(%v) = %v: want Fatal", err, w)
	}
}
