package redis_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/redisservers"
	"github.com/spate-go/spate/storeurl"
	"github.com/spate-go/spate/storeurl/storeurltest"
)

func TestURLDeployment(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t)
	storeurltest.Run(t, "redis://"+srv.Addr(), storeurl.Options{}, 500*time.Millisecond)

	// The namespace operations go through the database the URL names.
	ctx := t.Context()
	d, err := storeurl.Open(ctx, "redis://"+srv.Addr()+"/3", storeurl.Options{})
	require.NoError(t, err)
	defer d.Close()
	assert.Equal(t, "redis://"+srv.Addr()+"/3", d.Info().Description)
	st, err := d.Open(ctx, "in-db-3", time.Second)
	require.NoError(t, err)
	require.NoError(t, st.Close())
	keys, err := srv.Client(t).Keys(ctx, "spate:{in-db-3}:*").Result()
	require.NoError(t, err)
	assert.Empty(t, keys, "database 0 holds keys of a job opened on /3")
	jobs, err := d.Jobs(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"in-db-3"}, jobs)
}

// rediss:// with a client certificate (Options.TLS) and an ACL user whose
// password comes from the environment.
func TestURLDeploymentTLSAndACL(t *testing.T) {
	srv := redisservers.Start(t, redisservers.WithTLS(), redisservers.WithUser("job", "s3cret", "~spate:*", "+@all"))
	t.Setenv("SPATE_URLTEST_PASSWORD", "s3cret")
	raw := "rediss://job@" + srv.Addr()
	opts := storeurl.Options{TLS: srv.TLSConfig(), Password: storeurl.Secret{Env: "SPATE_URLTEST_PASSWORD"}}
	storeurltest.Run(t, raw, opts, 500*time.Millisecond)

	d, err := storeurl.Open(t.Context(), raw, storeurl.Options{TLS: srv.TLSConfig(), Password: storeurl.Secret{Value: "wrong-secret"}})
	require.NoError(t, err)
	defer d.Close()
	assert.True(t, d.Info().TLS)
	_, err = d.Open(t.Context(), "j", time.Second)
	require.Error(t, err)
	assert.ErrorIs(t, err, spate.ErrFatal)
	assert.Contains(t, err.Error(), "authentication failed")
	assert.NotContains(t, err.Error(), "wrong-secret")
}

func TestURLRefusals(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"redis://a:1,b:2":                                      "names one server",
		"redis://h:1?ca_file=" + "":                            "", // an empty parameter is no parameter
		"redis://a:s3cret@h:1?bogus=1":                         `unknown parameter "bogus" (redis:// takes client_name, `,
		"redis://h:1/2?pool_size=3&protocol=2&read_timeout=2s": "", // go-redis's own parameters pass
		"redis://a:s3cret@h:1/notadb":                          "invalid database number",
	} {
		d, err := storeurl.Open(t.Context(), raw, storeurl.Options{})
		if want == "" {
			require.NoError(t, err, raw)
			require.NoError(t, d.Close())
			continue
		}
		require.Error(t, err, raw)
		assert.ErrorContains(t, err, want, raw)
		assert.ErrorIs(t, err, spate.ErrFatal, raw)
		assert.NotContains(t, err.Error(), "s3cret")
	}
	_, err := storeurl.Open(t.Context(), "redis://h:1", storeurl.Options{TLS: redisservers.Start(t, redisservers.WithTLS()).TLSConfig()})
	assert.ErrorContains(t, err, "need a rediss:// URL")
}
