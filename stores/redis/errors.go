package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/spate-go/spate"
)

// retryableCodes are the server error codes that mean "not now": the server
// is loading its data set, a cluster slot is moving or down, a failover is
// under way, or the server is busy or out of memory. The command did not
// run, or ran on a node that is about to stop being the primary.
var retryableCodes = map[string]bool{
	"LOADING":     true, // loading the RDB or AOF after a restart
	"TRYAGAIN":    true, // cluster: multi-key operation during resharding
	"CLUSTERDOWN": true, // cluster: slot not served
	"MASTERDOWN":  true, // replica lost its primary
	"READONLY":    true, // wrote to a replica: a failover is in progress
	"MOVED":       true, // cluster redirect the client did not follow
	"ASK":         true,
	"BUSY":        true, // another script is running too long
	"NOREPLICAS":  true, // min-replicas-to-write not met
	"OOM":         true, // over maxmemory; may clear as keys expire
}

// classOf returns the class sentinel of a backend error: [spate.ErrRetryable]
// for transient failures, [spate.ErrFatal] for the rest.
//
// Server replies are classified by their error code. Anything else is a
// transport failure (the request or its reply was lost) and is Retryable,
// except a client the caller closed and a TLS peer that failed
// verification, which no retry can fix.
func classOf(err error) error {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return spate.ErrRetryable
	case errors.Is(err, goredis.ErrClosed):
		return spate.ErrFatal
	}
	if rerr, ok := errors.AsType[goredis.Error](err); ok {
		if retryableCodes[errorCode(rerr.Error())] || strings.HasPrefix(rerr.Error(), "ERR max number of clients") {
			return spate.ErrRetryable
		}
		// NOAUTH, WRONGPASS, NOPERM, unknown command, NOSCRIPT after the
		// fallback, WRONGTYPE (alien data under the job's keys), script
		// errors: none clears by itself.
		return spate.ErrFatal
	}
	var (
		verr  *tls.CertificateVerificationError
		uaerr x509.UnknownAuthorityError
		hnerr x509.HostnameError
		cierr x509.CertificateInvalidError
		rherr tls.RecordHeaderError
	)
	if errors.As(err, &verr) || errors.As(err, &uaerr) || errors.As(err, &hnerr) ||
		errors.As(err, &cierr) || errors.As(err, &rherr) {
		return spate.ErrFatal
	}
	// Everything else failed on the client side of the wire: a refused or
	// reset connection, EOF, a timeout, an exhausted pool. The request or its
	// reply was lost, so the command may or may not have run.
	return spate.ErrRetryable
}

// errorCode is the first word of a server error ("NOPERM", "ERR").
func errorCode(msg string) string {
	code, _, _ := strings.Cut(msg, " ")
	return code
}

// wrapErr adds its class to a backend error (the portable layer names the
// driver, the operation and the key).
func wrapErr(err error) error {
	return fmt.Errorf("%w: %w", err, classOf(err))
}
