package redis_test

import (
	"bytes"
	"log/slog"
	"os"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/internal/redisservers"
	"github.com/spate-go/spate/stores/redis"
)

// A server without the append-only file is reported (Capabilities) and
// warned about at startup; one with appendonly yes and appendfsync always
// reports nothing.
func TestPersistenceSettingsAreCheckedAtStartup(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		opts  []redisservers.Option
		unmet string
	}{
		{"appendonly no", nil, "appendonly yes (the server has appendonly no"},
		{"appendonly yes, appendfsync always", []redisservers.Option{redisservers.WithAOF()}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redisservers.Start(t, tc.opts...)
			var logs bytes.Buffer
			st, err := redis.New(t.Context(), srv.Client(t), redis.Options{Job: "persist", TTL: testTTL,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			require.NoError(t, err, "unmet persistence settings are a warning, not a refusal")
			defer st.Close()
			unmet := st.Capabilities().UnmetSettings
			if tc.unmet == "" {
				assert.Empty(t, unmet)
				assert.NotContains(t, logs.String(), "durability depends on")
				return
			}
			require.Len(t, unmet, 1)
			assert.True(t, strings.HasPrefix(unmet[0], tc.unmet), "%q", unmet[0])
			assert.Contains(t, logs.String(), "level=WARN")
			assert.Contains(t, logs.String(), "appendonly no")
		})
	}
}

// appendfsync everysec loses up to a second of acknowledged writes in a
// crash: reported too.
func TestAppendfsyncEverysecIsReported(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t, redisservers.WithAOF())
	c := srv.Client(t)
	require.NoError(t, c.ConfigSet(t.Context(), "appendfsync", "everysec").Err())
	st, err := redis.New(t.Context(), c, redis.Options{Job: "persist", TTL: testTTL})
	require.NoError(t, err)
	defer st.Close()
	unmet := st.Capabilities().UnmetSettings
	require.Len(t, unmet, 1)
	assert.Contains(t, unmet[0], "appendfsync everysec")
}

// A user denied INFO cannot see the server's persistence: the settings are
// reported unmet as not verified (naming the grant), not passed over. On
// main before this, such a user passed RequiredSettingsAreMet on a server
// with appendonly no.
func TestUnverifiablePersistenceIsUnmet(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t, redisservers.WithUser("noinfo", "pw", append(redis.ACLRules(), "-info")...))
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), Username: "noinfo", Password: "pw", ContextTimeoutEnabled: true})
	defer c.Close()
	st, err := redis.New(t.Context(), c, redis.Options{Job: "persist", TTL: testTTL})
	require.NoError(t, err)
	defer st.Close()
	unmet := st.Capabilities().UnmetSettings
	require.Len(t, unmet, 1)
	assert.Contains(t, unmet[0], "not verified: INFO is denied")
	assert.Contains(t, unmet[0], "+info")
}

// The ACL the documentation prints is ACLRules, word for word.
func TestTheDocumentedACLIsACLRules(t *testing.T) {
	want := "ACL SETUSER spate on >secret " + strings.Join(redis.ACLRules(), " ")
	for _, f := range []string{"doc.go", "redis.go"} {
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		assert.Contains(t, string(src), "//\t"+want+"\n", "%s prints another ACL than ACLRules", f)
	}
	assert.Contains(t, want, "+sunsubscribe", "the watches' subscriber drops channels with SUNSUBSCRIBE")
}
