package nats

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"slices"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/driver"
	"github.com/spate-go/spate/internal/version"
)

// Connect dials servers (a comma-separated URL list) with nats.go and
// classifies a failure: bad or expired credentials, an unreadable
// credentials file, missing permissions and TLS misconfiguration are Fatal
// (retrying cannot fix them); an unreachable server, a timeout or a done ctx
// are Retryable. The dial is bounded by ctx's deadline when it has one.
// The caller owns the returned connection.
func Connect(ctx context.Context, servers string, opts ...natsgo.Option) (*natsgo.Conn, error) {
	if err := driver.ContextError(ctx, driverName, "connect"); err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		// Clip: appending to the caller's slice would race callers that
		// share one option slice between concurrent connects.
		opts = append(slices.Clip(opts), natsgo.Timeout(max(time.Until(dl), time.Millisecond)))
	}
	nc, err := natsgo.Connect(servers, opts...)
	if err != nil {
		return nil, ClassifyConnectError(err)
	}
	return nc, nil
}

// ClassifyConnectError adds the spate class to an error from nats.Connect
// (see [Connect]).
func ClassifyConnectError(err error) error {
	if err == nil {
		return nil
	}
	if why := connectFatal(err); why != "" {
		return fmt.Errorf("nats: connect: %s: %w: %w", why, err, spate.ErrFatal)
	}
	return fmt.Errorf("nats: connect: %w: %w", err, spate.ErrRetryable)
}

// connectFatal names the misconfiguration behind a connection error, or
// returns "" when retrying might help.
func connectFatal(err error) string {
	var (
		unknownCA *x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		verify    *tls.CertificateVerificationError
		alert     tls.AlertError
		opErr     *net.OpError
		pathErr   *fs.PathError
	)
	switch {
	case errors.Is(err, natsgo.ErrAuthorization):
		return "authentication failed (check user/password, token, nkey or credentials)"
	case errors.Is(err, natsgo.ErrAuthExpired), errors.Is(err, natsgo.ErrAccountAuthExpired):
		return "credentials expired"
	case errors.Is(err, natsgo.ErrAuthRevoked):
		return "credentials revoked"
	case errors.Is(err, natsgo.ErrPermissionViolation):
		return "permission denied"
	case errors.Is(err, natsgo.ErrSecureConnRequired):
		return "the server requires TLS"
	case errors.Is(err, natsgo.ErrSecureConnWanted):
		return "TLS was asked for but the server does not offer it"
	case errors.Is(err, natsgo.ErrNkeyButNoSigCB), errors.Is(err, natsgo.ErrNkeysNotSupported),
		errors.Is(err, natsgo.ErrNoUserCB), errors.Is(err, natsgo.ErrUserButNoSigCB):
		return "nkey or credentials misconfigured"
	case errors.As(err, &pathErr):
		return "cannot read a credentials, key or certificate file"
	case errors.As(err, &unknownCA), errors.As(err, &hostname), errors.As(err, &invalid),
		errors.As(err, &verify):
		return "TLS certificate verification failed"
	case errors.As(err, &alert), errors.As(err, &opErr) && opErr.Op == "remote error":
		// crypto/tls reports an alert the server sent as a "remote error".
		return "the server refused the TLS handshake (client certificate missing or not trusted?)"
	}
	return ""
}

// checkServerVersion refuses a server older than MinServerVersion with a
// Fatal error that says to upgrade. v is the version from the server's INFO.
func checkServerVersion(v string) error {
	if v == "" {
		return fmt.Errorf("nats: open: the connection has no server version (not connected): %w", spate.ErrRetryable)
	}
	old, err := version.Older(v, MinServerVersion)
	if err != nil {
		return fmt.Errorf("nats: open: cannot parse the server version %q: %w", v, spate.ErrFatal)
	}
	if old {
		return fmt.Errorf("nats: open: nats-server %s is older than %s, which spate needs for limit markers (lease expiry reaches watchers only with them): upgrade the NATS servers to %s or newer: %w",
			v, MinServerVersion, MinServerVersion, spate.ErrFatal)
	}
	return nil
}
