package redis_test

import (
	"net"
	"slices"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/redisservers"
	"github.com/spate-go/spate/stores/redis"
)

// aclRules grants exactly what the package doc says the driver needs, minus
// the commands in without: keys, the channels of the same names,
// RequiredCommands and PushCommands.
func aclRules(keys string, without ...string) []string {
	rules := []string{"resetkeys", keys, "resetchannels", "&" + strings.TrimPrefix(keys, "~")}
	for _, c := range slices.Concat(redis.RequiredCommands, redis.PushCommands) {
		if !slices.Contains(without, c) {
			rules = append(rules, "+"+c)
		}
	}
	return rules
}

const password = "s3cret-pw"

func login(user, pw string) redisservers.HarnessOption {
	return redisservers.WithClientOptions(func(o *goredis.Options) {
		o.Username, o.Password = user, pw
	})
}

// TestACLAndTLSEndToEnd drives a store through a plain go-redis Client over
// TLS (with client certificates), logged in as an ACL user granted only
// redis.RequiredCommands on the driver's keys. (The full contract runs over
// TLS and ACL through a ClusterClient in TestStoreConformanceOnClusterWithACLAndTLS.)
func TestACLAndTLSEndToEnd(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t, redisservers.WithTLS(),
		redisservers.WithUser("spate", password, aclRules("~spate:*")...))
	// The server speaks only TLS, and the user is confined to the driver.
	plain := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), MaxRetries: -1})
	defer plain.Close()
	require.Error(t, plain.Ping(t.Context()).Err(), "a client without TLS reached the TLS-only server")
	user := srv.Client(t, func(o *goredis.Options) { o.Username, o.Password = "spate", password })
	err := user.Ping(t.Context()).Err()
	require.Error(t, err, "the ACL user may run PING (want NOPERM)")
	require.True(t, strings.HasPrefix(err.Error(), "NOPERM"), "the ACL user may run PING (want NOPERM): %v", err)

	h := srv.NewHarness(t, testTTL, login("spate", password))
	a, b := open(t, h), open(t, h)
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		ch, _ := watch(t, b, ks, "tls.")
		rev := create(t, a, ks, "tls.k", "v1")
		rev = update(t, a, ks, "tls.k", "v2", rev)
		for _, want := range []string{"v1", "v2"} {
			ev := recv(t, ch, "a put")
			require.Equal(t, spate.WatchPut, ev.Kind, "%v: watch over TLS saw %v %q, want put %q", ks, ev.Kind, ev.Value, want)
			require.Equal(t, want, string(ev.Value), "%v: watch over TLS, want put %q", ks, want)
		}
		list, err := b.List(t.Context(), ks, "tls.")
		require.NoError(t, err, "%v: list over TLS", ks)
		require.Len(t, list, 1, "%v: list over TLS", ks)
		require.Equal(t, rev, list[0].Revision, "%v: list over TLS: %v", ks, list)
		o, err := b.Delete(t.Context(), ks, "tls.k", rev)
		require.NoError(t, err, "%v: delete over TLS", ks)
		require.True(t, o.Won, "%v: delete over TLS: lost", ks)
		require.Equal(t, spate.WatchDelete, recv(t, ch, "the delete").Kind, "%v: watch over TLS, want the delete", ks)
	}
}

// TestStartupRejectsWhatTheDriverCannotUse: a server or ACL user the driver
// cannot work with is a Fatal error at New that names what is missing.
func TestStartupRejectsWhatTheDriverCannotUse(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t,
		redisservers.WithUser("noevalsha", password, aclRules("~spate:*", "evalsha")...),
		redisservers.WithUser("noeval", password, aclRules("~spate:*", "eval")...),
		redisservers.WithUser("noxadd", password, aclRules("~spate:*", "xadd")...),
		redisservers.WithUser("nozadd", password, aclRules("~spate:*", "zadd", "zrem")...),
		redisservers.WithUser("noxread", password, aclRules("~spate:*", "xread")...),
		redisservers.WithUser("otherkeys", password, aclRules("~other:*")...),
	)
	renamed := redisservers.Start(t, redisservers.WithArgs("--rename-command", "EVAL", ""))
	cases := []struct {
		name string
		srv  *redisservers.Server
		opt  redisservers.HarnessOption
		want []string
	}{
		{"WrongPassword", srv, login("noeval", "wrong"), []string{"authentication failed"}},
		{"ACLDeniesEVALSHA", srv, login("noevalsha", password), []string{`ACL user "noevalsha" lacks +evalsha (`}},
		{"ACLDeniesEVAL", srv, login("noeval", password), []string{`ACL user "noeval" lacks +eval (`}},
		{"ACLDeniesXREAD", srv, login("noxread", password), []string{`ACL user "noxread" lacks +xread (`}},
		{"ACLDeniesXADDInsideScripts", srv, login("noxadd", password), []string{`ACL user "noxadd" lacks +xadd,`}},
		{"ACLDeniesTwoCommands", srv, login("nozadd", password), []string{`lacks +zadd, +zrem,`}},
		{"ACLDeniesTheJobsKeys", srv, login("otherkeys", password), []string{`ACL user "otherkeys" lacks access to the job's keys`}},
		{"EVALRenamed", renamed, redisservers.WithClientOptions(func(*goredis.Options) {}),
			[]string{"does not accept EVAL", "rename-command"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := c.srv.NewHarness(t, testTTL, c.opt)
			st, err := h.Open(t.Context())
			if err == nil {
				_ = st.Close()
			}
			require.Error(t, err, "New succeeded; want a Fatal error naming %q", c.want)
			assert.ErrorIs(t, err, spate.ErrFatal, "New error is not Fatal")
			assert.True(t, spate.IsFatal(err), "New error is not Fatal: %v", err)
			for _, w := range c.want {
				assert.ErrorContains(t, err, w, "New error does not name what is missing")
			}
			t.Logf("New: %v", err)
		})
	}
}

// TestUnreachableServerIsRetryable: nothing listens on the port.
func TestUnreachableServerIsRetryable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	_ = l.Close()
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer c.Close()
	st, err := redis.New(t.Context(), c, redis.Options{Job: redisservers.NewJob(), TTL: testTTL})
	if err == nil {
		_ = st.Close()
	}
	require.Error(t, err, "New against a closed port succeeded")
	assert.ErrorIs(t, err, spate.ErrRetryable, "New against a closed port: want Retryable")
	assert.True(t, spate.IsRetryable(err), "New against a closed port: want Retryable, got %v", err)
	t.Logf("New: %v", err)
}

// TestTTLCannotChangeMidJob: the job records its TTL; another TTL is Fatal.
func TestTTLCannotChangeMidJob(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t)
	h := srv.NewHarness(t, testTTL)
	_, err := h.Open(t.Context())
	require.NoError(t, err)
	o := h.Options()
	o.TTL *= 2
	st, err := redis.New(t.Context(), h.NewClient(), o)
	if err == nil {
		_ = st.Close()
	}
	require.Error(t, err, "reopening the job with another TTL succeeded")
	assert.ErrorIs(t, err, spate.ErrFatal, "want a Fatal error saying the TTL cannot change")
	assert.ErrorContains(t, err, "TTL cannot change mid-job", "want a Fatal error saying the TTL cannot change")
}

func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	err := redis.Options{Job: "a b", TTL: redis.TTLFloor / 2, MaxValueSize: -1, ChangeLogLength: 5, SweepInterval: -1}.Validate()
	for _, w := range []string{"Job", "TTL", "MaxValueSize", "ChangeLogLength", "SweepInterval"} {
		assert.ErrorContains(t, err, w, "Validate does not report the bad %s", w)
	}
	assert.NoError(t, (redis.Options{Job: "job_1-x", TTL: redis.TTLFloor}).Validate(), "Validate rejects valid options")
	c := goredis.NewClient(&goredis.Options{})
	defer c.Close()
	_, err = redis.New(t.Context(), c, redis.Options{Job: "{x}", TTL: testTTL})
	assert.ErrorIs(t, err, spate.ErrFatal, "New with a bad job name: want Fatal")
}
