package redis_test

import (
	"errors"
	"net"
	"slices"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/redistest"
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

func login(user, pw string) redistest.HarnessOption {
	return redistest.WithClientOptions(func(o *goredis.Options) {
		o.Username, o.Password = user, pw
	})
}

// TestACLAndTLSEndToEnd drives a store through a plain go-redis Client over
// TLS (with client certificates), logged in as an ACL user granted only
// redis.RequiredCommands on the driver's keys. (The full contract runs over
// TLS and ACL through a ClusterClient in TestStoreConformanceOnClusterWithACLAndTLS.)
func TestACLAndTLSEndToEnd(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.WithTLS(),
		redistest.WithUser("spate", password, aclRules("~spate:*")...))
	// The server speaks only TLS, and the user is confined to the driver.
	plain := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), MaxRetries: -1})
	defer plain.Close()
	if err := plain.Ping(t.Context()).Err(); err == nil {
		t.Fatal("a client without TLS reached the TLS-only server")
	}
	user := srv.Client(t, func(o *goredis.Options) { o.Username, o.Password = "spate", password })
	if err := user.Ping(t.Context()).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
		t.Fatalf("the ACL user may run PING (want NOPERM): %v", err)
	}

	h := srv.NewHarness(t, testTTL, login("spate", password))
	a, b := open(t, h), open(t, h)
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		ch, _ := watch(t, b, ks, "tls.")
		rev := create(t, a, ks, "tls.k", "v1")
		rev = update(t, a, ks, "tls.k", "v2", rev)
		for _, want := range []string{"v1", "v2"} {
			if ev := recv(t, ch, "a put"); ev.Kind != spate.WatchPut || string(ev.Value) != want {
				t.Fatalf("%v: watch over TLS saw %v %q, want put %q", ks, ev.Kind, ev.Value, want)
			}
		}
		list, err := b.List(t.Context(), ks, "tls.")
		if err != nil || len(list) != 1 || list[0].Revision != rev {
			t.Fatalf("%v: list over TLS: %v %v", ks, list, err)
		}
		if o, err := b.Delete(t.Context(), ks, "tls.k", rev); err != nil || !o.Won {
			t.Fatalf("%v: delete over TLS: %v", ks, err)
		}
		if ev := recv(t, ch, "the delete"); ev.Kind != spate.WatchDelete {
			t.Fatalf("%v: watch over TLS saw %v, want the delete", ks, ev.Kind)
		}
	}
}

// TestStartupRejectsWhatTheDriverCannotUse: a server or ACL user the driver
// cannot work with is a Fatal error at New that names what is missing.
func TestStartupRejectsWhatTheDriverCannotUse(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t,
		redistest.WithUser("noevalsha", password, aclRules("~spate:*", "evalsha")...),
		redistest.WithUser("noeval", password, aclRules("~spate:*", "eval")...),
		redistest.WithUser("noxadd", password, aclRules("~spate:*", "xadd")...),
		redistest.WithUser("nozadd", password, aclRules("~spate:*", "zadd", "zrem")...),
		redistest.WithUser("noxread", password, aclRules("~spate:*", "xread")...),
		redistest.WithUser("otherkeys", password, aclRules("~other:*")...),
	)
	renamed := redistest.Start(t, redistest.WithArgs("--rename-command", "EVAL", ""))
	cases := []struct {
		name string
		srv  *redistest.Server
		opt  redistest.HarnessOption
		want []string
	}{
		{"WrongPassword", srv, login("noeval", "wrong"), []string{"authentication failed"}},
		{"ACLDeniesEVALSHA", srv, login("noevalsha", password), []string{`ACL user "noevalsha" lacks +evalsha (`}},
		{"ACLDeniesEVAL", srv, login("noeval", password), []string{`ACL user "noeval" lacks +eval (`}},
		{"ACLDeniesXREAD", srv, login("noxread", password), []string{`ACL user "noxread" lacks +xread (`}},
		{"ACLDeniesXADDInsideScripts", srv, login("noxadd", password), []string{`ACL user "noxadd" lacks +xadd,`}},
		{"ACLDeniesTwoCommands", srv, login("nozadd", password), []string{`lacks +zadd, +zrem,`}},
		{"ACLDeniesTheJobsKeys", srv, login("otherkeys", password), []string{`ACL user "otherkeys" lacks access to the job's keys`}},
		{"EVALRenamed", renamed, redistest.WithClientOptions(func(*goredis.Options) {}),
			[]string{"does not accept EVAL", "rename-command"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := c.srv.NewHarness(t, testTTL, c.opt)
			st, err := h.Open(t.Context())
			if err == nil {
				_ = st.Close()
				t.Fatalf("New succeeded; want a Fatal error naming %q", c.want)
			}
			if !errors.Is(err, spate.ErrFatal) || !spate.IsFatal(err) {
				t.Errorf("New error is not Fatal: %v", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("New error does not name what is missing (%q): %v", w, err)
				}
			}
			t.Logf("New: %v", err)
		})
	}
}

// TestUnreachableServerIsRetryable: nothing listens on the port.
func TestUnreachableServerIsRetryable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer c.Close()
	st, err := redis.New(t.Context(), c, redis.Options{Job: redistest.NewJob(), TTL: testTTL})
	if err == nil {
		_ = st.Close()
		t.Fatal("New against a closed port succeeded")
	}
	if !errors.Is(err, spate.ErrRetryable) || !spate.IsRetryable(err) {
		t.Errorf("New against a closed port: want Retryable, got %v", err)
	}
	t.Logf("New: %v", err)
}

// TestTTLCannotChangeMidJob: the job records its TTL; another TTL is Fatal.
func TestTTLCannotChangeMidJob(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	h := srv.NewHarness(t, testTTL)
	if _, err := h.Open(t.Context()); err != nil {
		t.Fatal(err)
	}
	o := h.Options()
	o.TTL *= 2
	st, err := redis.New(t.Context(), h.NewClient(), o)
	if err == nil {
		_ = st.Close()
		t.Fatal("reopening the job with another TTL succeeded")
	}
	if !errors.Is(err, spate.ErrFatal) || !strings.Contains(err.Error(), "TTL cannot change mid-job") {
		t.Errorf("want a Fatal error saying the TTL cannot change, got %v", err)
	}
}

func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	err := redis.Options{Job: "a b", TTL: redis.TTLFloor / 2, MaxValueSize: -1, ChangeLogLength: 5, SweepInterval: -1}.Validate()
	for _, w := range []string{"Job", "TTL", "MaxValueSize", "ChangeLogLength", "SweepInterval"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Validate does not report the bad %s: %v", w, err)
		}
	}
	if err := (redis.Options{Job: "job_1-x", TTL: redis.TTLFloor}).Validate(); err != nil {
		t.Errorf("Validate rejects valid options: %v", err)
	}
	c := goredis.NewClient(&goredis.Options{})
	defer c.Close()
	_, err = redis.New(t.Context(), c, redis.Options{Job: "{x}", TTL: testTTL})
	if !errors.Is(err, spate.ErrFatal) {
		t.Errorf("New with a bad job name: want Fatal, got %v", err)
	}
}
