package nats_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/natsservers"
	spatenats "github.com/spate-go/spate/stores/nats"
	"github.com/spate-go/spate/storeurl"
	"github.com/spate-go/spate/storeurl/storeurltest"
)

func hostOf(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	return u.Host
}

func TestURLDeployment(t *testing.T) {
	t.Parallel()
	srv := natsservers.Start(t)
	storeurltest.Run(t, srv.URL, storeurl.Options{}, 2*time.Second)
}

// TLS with a CA file and a password from a file, in the URL.
func TestURLDeploymentTLSAndPassword(t *testing.T) {
	t.Parallel()
	srv := natsservers.Start(t, natsservers.WithTLS(false), natsservers.WithUserPassword("spate", "s3cret"))
	pw := filepath.Join(t.TempDir(), "pw")
	require.NoError(t, os.WriteFile(pw, []byte("s3cret\n"), 0o600))
	raw := "tls://spate@" + hostOf(t, srv.URL) + "?replicas=1&ca_file=" + srv.CAFile + "&password_file=" + pw
	storeurltest.Run(t, raw, storeurl.Options{}, 2*time.Second)
	d, err := storeurl.Open(t.Context(), raw, storeurl.Options{})
	require.NoError(t, err)
	defer d.Close()
	assert.True(t, d.Info().TLS)
	assert.Equal(t, "nats at tls://"+hostOf(t, srv.URL)+" (buckets R1)", d.Info().Description)
}

// A lone user name is a token, as nats.go reads it; a wrong one is Fatal
// and not shown.
func TestURLDeploymentToken(t *testing.T) {
	t.Parallel()
	srv := natsservers.Start(t, natsservers.WithToken("right-token"))
	host := hostOf(t, srv.URL)
	storeurltest.Run(t, "nats://right-token@"+host, storeurl.Options{}, 2*time.Second)

	d, err := storeurl.Open(t.Context(), "nats://wrong-token@"+host, storeurl.Options{})
	require.NoError(t, err)
	defer d.Close()
	assert.Equal(t, "nats at nats://"+host+" (buckets R1)", d.Info().Description)
	_, err = d.Open(t.Context(), "j", 2*time.Second)
	require.Error(t, err)
	assert.ErrorIs(t, err, spate.ErrFatal)
	assert.Contains(t, err.Error(), "authentication failed")
	assert.NotContains(t, err.Error(), "wrong-token")
}

func TestURLDeploymentCreds(t *testing.T) {
	t.Parallel()
	srv := natsservers.Start(t, natsservers.WithCreds())
	storeurltest.Run(t, "nats://"+hostOf(t, srv.URL)+"?creds="+srv.CredsFile, storeurl.Options{}, 2*time.Second)
}

func TestURLRefusals(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"nats://":                     "names no NATS server",
		"nats://h:1/x":                "take no path",
		"nats://h:1?replicas=2":       "replicas must be 1, 3 or 5",
		"nats://a:s3cret@h:1?bogus=1": `unknown parameter "bogus" (nats:// takes replicas, creds`,
	} {
		_, err := storeurl.Open(t.Context(), raw, storeurl.Options{})
		require.Error(t, err, raw)
		assert.ErrorContains(t, err, want, raw)
		assert.NotContains(t, err.Error(), "s3cret")
	}
}

// A user without a permission a namespace operation needs is told which
// at once, not after a timeout: issue 16's operator re-run saw a user
// without JetStream permissions wait out --connect-timeout, the refused
// subject only on nats.go's own stderr line.
func TestURLDeploymentNamesAMissingPermission(t *testing.T) {
	t.Parallel()
	job := natsservers.NewJob()
	_, eph := spatenats.Buckets(job)
	drop := "$JS.API.STREAM.INFO.KV_" + eph
	srv := permServer(t, job, drop)
	d, err := storeurl.Open(t.Context(), "nats://spate:pw@"+hostOf(t, srv.URL), storeurl.Options{})
	require.NoError(t, err)
	defer d.Close()
	ctx, cancel := context.WithTimeout(t.Context(), permCallCtx)
	defer cancel()
	start := time.Now()
	_, _, err = d.RecordedTTL(ctx, job)
	took := time.Since(start)
	require.Error(t, err)
	t.Logf("after %v: %v", took, err)
	assert.NoError(t, ctx.Err(), "the call returned only when its context ended: a missing permission must fail it")
	assert.True(t, spate.IsFatal(err), "a missing permission is Fatal: %v", err)
	assert.ErrorContains(t, err, `may not publish to "`+drop+`"`)
}
