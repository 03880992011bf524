package etcd_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/etcdservers"
	"github.com/spate-go/spate/stores/etcd"
	"github.com/spate-go/spate/storeurl"
	"github.com/spate-go/spate/storeurl/storeurltest"
)

func TestURLDeployment(t *testing.T) {
	t.Parallel()
	c := etcdservers.Start(t, etcdservers.Options{})
	host := c.Members()[0].ClientURL.Host
	storeurltest.Run(t, "etcd://"+host, storeurl.Options{}, time.Second)

	// Another root keeps its jobs apart from the default one's.
	ctx := t.Context()
	other, err := storeurl.Open(ctx, "etcd://"+host+"?prefix=/other/", storeurl.Options{})
	require.NoError(t, err)
	defer other.Close()
	assert.Equal(t, "etcd at http://"+host+" (jobs under /other/)", other.Info().Description)
	st, err := other.Open(ctx, "j", time.Second)
	require.NoError(t, err)
	_, err = st.Create(ctx, spate.Durable, "k", nil)
	require.NoError(t, err)
	require.NoError(t, st.Close())
	def, err := storeurl.Open(ctx, "etcd://"+host, storeurl.Options{})
	require.NoError(t, err)
	defer def.Close()
	ok, err := def.JobExists(ctx, "j")
	require.NoError(t, err)
	assert.False(t, ok, "a job under /other/ shows under /spate/")
	jobs, err := other.Jobs(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"j"}, jobs)
	require.NoError(t, other.DeleteJob(ctx, "j"))
}

// TLS with a client certificate and a password from a file, all in the
// URL; a wrong password is a Fatal error from Open.
func TestURLDeploymentTLSAndAuth(t *testing.T) {
	t.Parallel()
	c := etcdservers.Start(t, etcdservers.Options{TLS: true, Auth: true})
	host := c.Members()[0].ClientURL.Host
	dir := t.TempDir()
	pw := filepath.Join(dir, "password")
	require.NoError(t, os.WriteFile(pw, []byte(etcdservers.JobPass+"\n"), 0o600))
	raw := fmt.Sprintf("etcds://%s@%s?ca_file=%s&cert_file=%s&key_file=%s&password_file=%s",
		etcdservers.JobUser, host, c.CA.CertFile, c.ClientCert.CertFile, c.ClientCert.KeyFile, pw)
	storeurltest.Run(t, raw, storeurl.Options{}, time.Second)

	d, err := storeurl.Open(t.Context(), raw, storeurl.Options{Password: storeurl.Secret{Value: "wrong-secret"}})
	require.NoError(t, err)
	defer d.Close()
	info := d.Info()
	assert.True(t, info.TLS)
	assert.Equal(t, "etcd at https://"+host, info.Description)
	_, err = d.Open(t.Context(), "j", time.Second)
	require.Error(t, err)
	assert.ErrorIs(t, err, spate.ErrFatal)
	assert.NotContains(t, err.Error(), "wrong-secret")
}

func TestURLRefusals(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"etcd://":                "names no etcd endpoint",
		"etcd://h:1/path":        "take no path",
		"etcd://h:1?prefix=nope": "prefix",
		"etcd://h:1?replicas=3":  `unknown parameter "replicas" (etcd:// takes prefix`,
	} {
		_, err := storeurl.Open(t.Context(), raw, storeurl.Options{})
		require.Error(t, err, raw)
		assert.ErrorContains(t, err, want, raw)
		assert.ErrorIs(t, err, spate.ErrFatal, raw)
	}
	assert.Equal(t, "/spate/j/", etcd.JobPrefix(etcd.DefaultRoot, "j"))
}
