package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// No secret in a store URL, a secret file or the environment reaches what
// the CLI prints or records: the store's description (stdout, inspect, the
// history file, retry lines), the errors of a bad URL, and the commands it
// suggests.
func TestStoreSecretsAreNeverShown(t *testing.T) {
	const secret = "s3cret-do-not-print"
	pwFile := filepath.Join(t.TempDir(), "pw")
	require.NoError(t, os.WriteFile(pwFile, []byte(secret+"\n"), 0o600))
	t.Setenv(envPassword, secret)
	t.Setenv(envToken, secret)
	for _, raw := range []string{
		"nats://" + secret + "@127.0.0.1:1",
		"nats://alice:" + secret + "@127.0.0.1:1,nats://alice:" + secret + "@127.0.0.2:1",
		"tls://alice:" + secret + "@127.0.0.1:1",
		"redis://default:" + secret + "@127.0.0.1:1/0",
		"redis://127.0.0.1:1/0?password_file=" + pwFile,
		"etcd://root:" + secret + "@127.0.0.1:1",
		"etcd://root@127.0.0.1:1?password_file=" + pwFile,
	} {
		f := &storeFlags{url: raw}
		c, err := f.connect(context.Background(), slog.New(slog.DiscardHandler), connectStart)
		require.NoError(t, err, redactStoreURL(raw))
		assert.NotContains(t, c.describe, secret, "the store's description shows the secret of %s", redactStoreURL(raw))
		assert.NotContains(t, c.describe, "@", "the store's description shows the user info of %s", redactStoreURL(raw))
		c.close()
		bf := &backfillFlags{store: *f}
		assert.NotContains(t, bf.storeArgs("job"), secret, "a suggested command shows the secret of %s", redactStoreURL(raw))
	}
	for _, raw := range []string{
		"nats://alice:" + secret + "@127.0.0.1:1?replicas=2",
		"nats://alice:" + secret + "@127.0.0.1:1?bogus=1",
		"bogus://alice:" + secret + "@127.0.0.1:1",
		"redis://alice:" + secret + "@127.0.0.1:notaport/x/y",
		"redis://alice:" + secret + "@127.0.0.1:1/x?password=" + secret,
		"etcd://alice:" + secret + "@127.0.0.1:1/path?token=" + secret,
		"etcd://alice:s3c?ret-do-not-print@127.0.0.1:1",
	} {
		_, err := (&storeFlags{url: raw}).connect(context.Background(), slog.New(slog.DiscardHandler), connectStart)
		require.Error(t, err, raw)
		assert.False(t, strings.Contains(err.Error(), secret), "the error for a bad URL shows its secret: %v", err)
		assert.NotContains(t, err.Error(), "ret-do-not-print")
	}
}
