package storeurl_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/testcerts"
	"github.com/spate-go/spate/stores/mem"
	"github.com/spate-go/spate/storeurl"
)

const secret = "s3cret-do-not-show"

// fakeDeployment records what its opener was given and serves mem stores.
type fakeDeployment struct {
	cfg    *storeurl.Config
	closed int
	jobs   map[string]bool
}

func (f *fakeDeployment) Info() storeurl.Info {
	return storeurl.Info{Driver: "fake", Description: "fake"}
}

func (f *fakeDeployment) Open(_ context.Context, job string, ttl time.Duration) (spate.Store, error) {
	f.jobs[job] = true
	return mem.New(mem.Options{TTL: ttl})
}

func (f *fakeDeployment) Jobs(context.Context) ([]string, error) {
	var out []string
	for j := range f.jobs {
		out = append(out, j)
	}
	return out, nil
}

func (f *fakeDeployment) JobExists(_ context.Context, job string) (bool, error) {
	return f.jobs[job], nil
}

func (f *fakeDeployment) DeleteJob(_ context.Context, job string) error {
	delete(f.jobs, job)
	return nil
}

func (f *fakeDeployment) RecordedTTL(context.Context, string) (time.Duration, bool, error) {
	return 0, false, nil
}

func (f *fakeDeployment) Close() error {
	f.closed++
	return nil
}

// fakeMux is a mux with the fake scheme; opened collects the deployments.
func fakeMux(t *testing.T) (*storeurl.Mux, *[]*fakeDeployment) {
	t.Helper()
	var opened []*fakeDeployment
	m := new(storeurl.Mux)
	m.Register("fake", storeurl.OpenerFunc(func(_ context.Context, cfg *storeurl.Config) (storeurl.Deployment, error) {
		d := &fakeDeployment{cfg: cfg, jobs: map[string]bool{}}
		opened = append(opened, d)
		return d, nil
	}))
	m.Register("strict", storeurl.OpenerFunc(func(_ context.Context, cfg *storeurl.Config) (storeurl.Deployment, error) {
		if err := cfg.CheckParams("replicas"); err != nil {
			return nil, err
		}
		return &fakeDeployment{cfg: cfg, jobs: map[string]bool{}}, nil
	}))
	return m, &opened
}

func TestRegistry(t *testing.T) {
	m, opened := fakeMux(t)
	assert.Equal(t, []string{"fake", "strict"}, m.Schemes())
	assert.True(t, m.ValidScheme("FAKE"))
	assert.False(t, m.ValidScheme("etcd"))

	assert.PanicsWithValue(t, `storeurl: Register: scheme "fake" registered twice`, func() {
		m.Register("fake", storeurl.OpenerFunc(nil))
	})
	assert.Panics(t, func() { m.Register("Fake", storeurl.OpenerFunc(nil)) }, "an upper-case scheme")
	assert.Panics(t, func() { m.Register("other", nil) }, "a nil opener")

	d, err := m.Open(t.Context(), "FAKE://alice:pw@h1:1,h2:2/db?x=1&y=2", storeurl.Options{})
	require.NoError(t, err)
	require.Len(t, *opened, 1)
	cfg := (*opened)[0].cfg
	assert.Equal(t, "fake", cfg.Scheme)
	assert.Equal(t, []string{"h1:1", "h2:2"}, cfg.Hosts)
	assert.Equal(t, "/db", cfg.Path)
	assert.Equal(t, url.Values{"x": {"1"}, "y": {"2"}}, cfg.Params)
	assert.Equal(t, "alice", cfg.Username)
	assert.Equal(t, "pw", cfg.Password)
	assert.Nil(t, cfg.TLS)
	assert.Equal(t, storeurl.DefaultDialTimeout, cfg.DialTimeout)
	assert.NotNil(t, cfg.Logger)
	assert.Equal(t, "fake", d.Info().Driver)

	// A list of full URLs is a host list.
	_, err = m.Open(t.Context(), "fake://alice:pw@a:1,fake://alice:pw@b:2?x=1", storeurl.Options{})
	require.NoError(t, err)
	assert.Equal(t, []string{"a:1", "b:2"}, (*opened)[1].cfg.Hosts)
	assert.Equal(t, "pw", (*opened)[1].cfg.Password)

	// The default mux holds what the imported drivers registered.
	assert.Contains(t, storeurl.Schemes(), "mem")
}

// Every Deployment call checks its job name before the driver sees it,
// and OpenStore's store closes its deployment.
func TestDeploymentChecksJobsAndOpenStoreOwnsTheDeployment(t *testing.T) {
	m, opened := fakeMux(t)
	d, err := m.Open(t.Context(), "fake://h:1", storeurl.Options{})
	require.NoError(t, err)
	for _, bad := range []string{"", "a/b", "a.b", string(make([]byte, 65))} {
		_, err := d.Open(t.Context(), bad, time.Second)
		assert.ErrorIs(t, err, spate.ErrFatal, "job %q", bad)
		_, err = d.JobExists(t.Context(), bad)
		assert.ErrorIs(t, err, spate.ErrFatal, "job %q", bad)
		assert.ErrorIs(t, d.DeleteJob(t.Context(), bad), spate.ErrFatal, "job %q", bad)
	}
	_, err = d.Open(t.Context(), "ok", 0)
	assert.ErrorIs(t, err, spate.ErrFatal, "a zero TTL")
	assert.Empty(t, (*opened)[0].jobs, "the driver saw a bad argument")

	st, err := m.OpenStore(t.Context(), "fake://h:1", "job-1", time.Second, storeurl.Options{})
	require.NoError(t, err)
	fd := (*opened)[1]
	assert.True(t, fd.jobs["job-1"])
	assert.Zero(t, fd.closed)
	require.NoError(t, st.Close())
	assert.Equal(t, 1, fd.closed)
}

func TestBadURLs(t *testing.T) {
	m, _ := fakeMux(t)
	for raw, want := range map[string]string{
		"":                                "not a store URL",
		"127.0.0.1:2379":                  "not a store URL",
		"fa ke://h":                       "is not a URL scheme",
		"fake://h:notaport":               `invalid server address "h:notaport"`,
		"fake://a:1,other://b:2":          "share one scheme",
		"fake://u:p@a:1,fake://v:q@b:2":   "share one set of credentials",
		"fake://a:1/x,b:2":                "a path may follow only the last server",
		"fake://h:1?x=%zz":                "invalid query",
		"fake://h:1?x=1&x=2":              `parameter "x" is given 2 times`,
		"fake://h:1#frag":                 "no fragment",
		"fake://h:1/%zz":                  "invalid %-escape in the path",
		"strict://h:1?replicas=3&bogus=1": `unknown parameter "bogus" (strict:// takes replicas; every scheme takes ca_file`,
		"fake://h:1?" + storeurl.ParamCertFile + "=c.pem": "cert_file and key_file go together",
	} {
		_, err := m.Open(t.Context(), raw, storeurl.Options{})
		require.Error(t, err, raw)
		assert.Contains(t, err.Error(), want, raw)
		assert.ErrorIs(t, err, spate.ErrFatal, raw)
	}
	_, err := m.Open(t.Context(), "fake://h:1?x=1", storeurl.Options{Params: url.Values{"x": {"2"}}})
	assert.ErrorContains(t, err, `parameter "x" is given twice`)
}

func TestUnknownSchemeListsTheRegisteredOnes(t *testing.T) {
	m, _ := fakeMux(t)
	_, err := m.Open(t.Context(), "bogus://alice:"+secret+"@h:1", storeurl.Options{})
	require.Error(t, err)
	assert.ErrorIs(t, err, spate.ErrFatal)
	assert.Equal(t, `store URL "bogus://alice:xxxxx@h:1": unknown scheme "bogus" (registered: fake, strict)`, err.Error())

	_, err = m.Open(t.Context(), "postgres://u:"+secret+"@h:notaport/db", storeurl.Options{})
	assert.ErrorContains(t, err, `unknown scheme "postgres" (registered: fake, strict)`, "an unknown scheme comes first")
	assert.NotContains(t, err.Error(), secret)

	_, err = new(storeurl.Mux).Open(t.Context(), "etcd://h:1", storeurl.Options{})
	assert.ErrorContains(t, err, `unknown scheme "etcd": no store driver is registered (import one`)
}

func TestSecretsFromFilesEnvAndOptions(t *testing.T) {
	m, opened := fakeMux(t)
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "pw")
	require.NoError(t, os.WriteFile(pwFile, []byte("from-file\n"), 0o600))
	tokFile := filepath.Join(dir, "tok")
	require.NoError(t, os.WriteFile(tokFile, []byte("token-file\r\n"), 0o600))
	t.Setenv("STOREURL_TEST_PW", "from-env")

	last := func() *storeurl.Config { return (*opened)[len(*opened)-1].cfg }
	for _, tc := range []struct {
		name, raw  string
		opts       storeurl.Options
		user, pass string
		token      string
	}{
		{"URL", "fake://u:from-url@h:1", storeurl.Options{}, "u", "from-url", ""},
		{"file beats URL", "fake://u:from-url@h:1?password_file=" + pwFile + "&token_file=" + tokFile,
			storeurl.Options{}, "u", "from-file", "token-file"},
		{"options beat file", "fake://u:from-url@h:1?password_file=" + pwFile,
			storeurl.Options{Username: "v", Password: storeurl.Secret{Value: "from-options"}}, "v", "from-options", ""},
		{"env", "fake://u@h:1", storeurl.Options{Password: storeurl.Secret{Env: "STOREURL_TEST_PW"}}, "u", "from-env", ""},
		{"unset env falls through", "fake://u:from-url@h:1",
			storeurl.Options{Password: storeurl.Secret{Env: "STOREURL_TEST_UNSET"}}, "u", "from-url", ""},
		{"options file", "fake://h:1", storeurl.Options{Token: storeurl.Secret{File: tokFile}}, "", "", "token-file"},
		{"escaped", "fake://u%40x:p%2Cw%40@h:1", storeurl.Options{}, "u@x", "p,w@", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.Open(t.Context(), tc.raw, tc.opts)
			require.NoError(t, err)
			c := last()
			assert.Equal(t, tc.user, c.Username)
			assert.Equal(t, tc.pass, c.Password)
			assert.Equal(t, tc.token, c.Token)
			assert.Empty(t, c.Params, "the common parameters reach the driver")
		})
	}

	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	for _, raw := range []string{
		"fake://u:" + secret + "@h:1?password_file=" + filepath.Join(dir, "absent"),
		"fake://u:" + secret + "@h:1?token_file=" + empty,
	} {
		_, err := m.Open(t.Context(), raw, storeurl.Options{})
		require.Error(t, err, raw)
		assert.ErrorIs(t, err, spate.ErrFatal)
		assert.NotContains(t, err.Error(), secret)
	}
}

func TestTLSFromFiles(t *testing.T) {
	m, opened := fakeMux(t)
	ca := testcerts.NewCA(t, "storeurl")
	client := ca.MustClient(t, "spate")
	_, err := m.Open(t.Context(), fmt.Sprintf("fake://h:1?ca_file=%s&cert_file=%s&key_file=%s", ca.CertFile, client.CertFile, client.KeyFile),
		storeurl.Options{})
	require.NoError(t, err)
	cfg := (*opened)[0].cfg.TLS
	require.NotNil(t, cfg)
	assert.NotNil(t, cfg.RootCAs)
	assert.Len(t, cfg.Certificates, 1)
	assert.Equal(t, uint16(tls.VersionTLS12), cfg.MinVersion)

	// The parameters apply to a copy of Options.TLS.
	base := &tls.Config{ServerName: "store.example", MinVersion: tls.VersionTLS13}
	_, err = m.Open(t.Context(), "fake://h:1?ca_file="+ca.CertFile, storeurl.Options{TLS: base})
	require.NoError(t, err)
	cfg = (*opened)[1].cfg.TLS
	assert.Equal(t, "store.example", cfg.ServerName)
	assert.NotNil(t, cfg.RootCAs)
	assert.Nil(t, base.RootCAs, "Options.TLS was modified")

	_, err = m.Open(t.Context(), "fake://h:1?ca_file="+client.KeyFile, storeurl.Options{})
	assert.ErrorContains(t, err, "holds no PEM certificate")
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"nats://s3cret@127.0.0.1:4222":                          "nats://xxxxx@127.0.0.1:4222",
		"nats://alice:s3cret@a:4222,nats://alice:s3cret@b:4222": "nats://alice:xxxxx@a:4222,nats://alice:xxxxx@b:4222",
		"tls://alice:s3cret@a:4222?replicas=3":                  "tls://alice:xxxxx@a:4222?replicas=3",
		"redis://default:s3cret@127.0.0.1:6379/2":               "redis://default:xxxxx@127.0.0.1:6379/2",
		"rediss://:s3cret@host:6380":                            "rediss://:xxxxx@host:6380",
		"etcd://root:s3cret@h1:2379,h2:2379":                    "etcd://root:xxxxx@h1:2379,h2:2379",
		"etcd://h1:2379,h2:2379":                                "etcd://h1:2379,h2:2379",
		"nats://127.0.0.1:4222":                                 "nats://127.0.0.1:4222",
		"mem://":                                                "mem://",
		// An '@' past the server may end a password holding a '/' or
		// a '?' (user h, password 6379/0?user=a): masked up to it.
		"redis://h:6379/0?user=a@b":            "redis://h:xxxxx@b",
		"redis://user:pa/ss@host:6379":         "redis://user:xxxxx@host:6379",
		"nats://tok/en@host:4222":              "nats://xxxxx@host:4222",
		"etcd://u:p@ss/w?rd@a:1,b:2/x?token=t": "etcd://u:xxxxx@a:1,b:2/x?token=xxxxx",
		"etcd://u:p@a:1,u:p@b:2":               "etcd://u:xxxxx@a:1,u:xxxxx@b:2",
		"nats://u:p,nats://q@a:1":              "nats://u:xxxxx@a:1",
		"nats://u:p@a:1,nats://v:q@b:1":        "nats://u:xxxxx@b:1",
		// Stronger than url.URL.Redacted: query secrets, and passwords
		// holding characters a URL should have escaped.
		"redis://h:6379/0?password=s3cret&client_name=x":        "redis://h:6379/0?password=xxxxx&client_name=x",
		"nats://h:4222?auth_token=s3cret&password_file=/run/pw": "nats://h:4222?auth_token=xxxxx&password_file=/run/pw",
		"redis://u:s3?cr,et@h:6379":                             "redis://u:xxxxx@h:6379",
		"redis://s3,cr?et@h:6379":                               "redis://xxxxx@h:6379",
		"redis://u:s3cr#et@h:6379":                              "redis://u:xxxxx@h:6379",
		"alice:s3cret@h:1":                                      "alice:xxxxx@h:1",
		"h:1?x=1#s3cret":                                        "h:1?x=1#xxxxx",
	} {
		assert.Equal(t, want, storeurl.Redact(in), "Redact(%q)", in)
	}
}

// The resolved secrets never show: not through fmt (any verb) nor
// log/slog, on the Config a driver gets or on the Options a caller holds.
func TestConfigAndSecretsFormatRedacted(t *testing.T) {
	m, opened := fakeMux(t)
	opts := storeurl.Options{Password: storeurl.Secret{Value: secret}, Token: storeurl.Secret{Value: secret}}
	_, err := m.Open(t.Context(), "fake://alice:"+secret+"@h:1?token="+secret, opts)
	require.NoError(t, err)
	cfg := (*opened)[0].cfg
	require.Equal(t, secret, cfg.Password)
	var logged bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logged, nil))
	log.Info("opening", "store", cfg, "opts", opts.Password, "token", opts.Token)
	for _, shown := range []string{
		fmt.Sprint(cfg), fmt.Sprintf("%v %+v %#v %s", cfg, cfg, cfg, cfg),
		fmt.Sprintf("%v %+v %#v", opts, opts, opts), cfg.Redacted(), logged.String(),
	} {
		assert.NotContains(t, shown, secret)
	}
	assert.Contains(t, cfg.String(), "fake://alice:xxxxx@h:1?token=xxxxx")
	assert.Equal(t, "xxxxx", opts.Password.String())
	assert.Equal(t, "", storeurl.Secret{}.String())

	var e *storeurl.Error
	err = cfg.Errorf("broke: %w", errors.New("cause"))
	require.ErrorAs(t, err, &e)
	assert.Equal(t, `store URL "fake://alice:xxxxx@h:1?token=xxxxx": broke: cause`, err.Error())
	assert.ErrorIs(t, err, spate.ErrFatal)
}

// OpenStore's wrapper passes the Releaser capability of the store on.
func TestOpenStorePassesTheReleaserOn(t *testing.T) {
	st, err := storeurl.OpenStore(t.Context(), "mem://", "job-1", time.Second, storeurl.Options{})
	require.NoError(t, err)
	defer st.Close()
	r, ok := spate.ReleaserOf(st)
	require.True(t, ok, "mem has the capability")
	rec, err := st.Create(t.Context(), spate.Durable, "split.a", []byte("owned"))
	require.NoError(t, err)
	lease, err := st.Create(t.Context(), spate.Ephemeral, "split.a", []byte("lease"))
	require.NoError(t, err)
	u, d, err := r.UpdateAndDelete(t.Context(), "split.a", []byte("released"), rec.Revision, "split.a", lease.Revision)
	require.NoError(t, err)
	assert.True(t, u.Won && d.Won)
}
