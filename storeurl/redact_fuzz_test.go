package storeurl_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/storeurl"
	// The real drivers: their openers must keep secrets out of their
	// errors and descriptions too.
	_ "github.com/spate-go/spate/stores/etcd"
	_ "github.com/spate-go/spate/stores/mem"
	_ "github.com/spate-go/spate/stores/nats"
	_ "github.com/spate-go/spate/stores/redis"
)

// urlShapes place a secret (%[2]s) in a store URL of scheme %[1]s: as a
// password, a lone user name (a NATS token), in a list of servers, in
// query parameters, in URLs that are malformed around it, and without a
// scheme.
var urlShapes = []string{
	"%[1]s://user:%[2]s@127.0.0.1:1",
	"%[1]s://%[2]s@127.0.0.1:1",
	"%[1]s://user:%[2]s@127.0.0.1:1/0",
	"%[1]s://user:%[2]s@127.0.0.1:1/x/y?bogus=1",
	"%[1]s://user:%[2]s@a:1,b:2",
	"%[1]s://user:%[2]s@a:1,%[1]s://user:%[2]s@b:2",
	"%[1]s://a:1,%[1]s://user:%[2]s@b:2",
	"%[1]s://user:%[2]s@127.0.0.1:notaport",
	"%[1]s://user:%[2]s@",
	"%[1]s://user:%[2]s@127.0.0.1:1?replicas=2",
	"%[1]s://user:%[2]s@127.0.0.1:1#frag",
	"%[1]s://127.0.0.1:1/?password=%[2]s",
	"%[1]s://127.0.0.1:1?token=%[2]s",
	"%[1]s://127.0.0.1:1?auth_token=%[2]s&bogus=1",
	"%[1]s://127.0.0.1:1/0?client_name=x&secret=%[2]s",
	"%[1]s://127.0.0.1:1?replicas=3&key=%[2]s#frag",
	"%[1]s://user:%[2]s@127.0.0.1:1?password=%[2]s&token=%[2]s",
	"user:%[2]s@127.0.0.1:1",
	"%[2]s@127.0.0.1:1",
	" %[1]s://user:%[2]s@127.0.0.1:1 ",
}

// schemes are the registered ones, an unknown one and a malformed one.
var fuzzSchemes = []string{"etcd", "etcds", "redis", "rediss", "nats", "tls", "mem", "bogus", "fa ke"}

// No printed form of a store URL holds its secret, whatever characters
// the secret holds (unescaped / ? # @ % : , included, or escaped as a
// user should): not the redacted URL, not the error of opening it (a
// malformed URL, an unknown scheme or parameter, a driver's refusal),
// not the description of the deployment it opens, not the Config a
// driver gets as fmt and log/slog print it.
func FuzzRedactHidesSecrets(f *testing.F) {
	for _, s := range []string{
		"s3cret", "pa/ss", "pa?ss", "pa#ss", "pa@ss", "pa%ss", "pa%2Fss", "pa:ss", "pa,ss", "p/a?s#s@w:o%r,d",
		"://", "a@b,user:a", ",nats://x", "x@host:1", "6379/0?user=a", "&bogus=1", "=", "%zz", " ", "",
		"@127.0.0.1:1/", ",b:2", "Z9@b,user:Pw", "\x00\xff", "ü/ñ", "xxxxx",
	} {
		for shape := range urlShapes {
			for scheme := range fuzzSchemes {
				f.Add(s, uint8(shape), uint8(scheme), false)
				if shape == 0 || shape == 12 {
					f.Add(s, uint8(shape), uint8(scheme), true)
				}
			}
		}
	}
	m := new(storeurl.Mux)
	var cfgs []*storeurl.Config
	m.Register("fake", storeurl.OpenerFunc(func(_ context.Context, cfg *storeurl.Config) (storeurl.Deployment, error) {
		cfgs = append(cfgs, cfg)
		return &fakeDeployment{cfg: cfg, jobs: map[string]bool{}}, nil
	}))
	f.Fuzz(func(t *testing.T, fuzzed string, shape, scheme uint8, escape bool) {
		// The markers make the secret distinct from the rest of the URL:
		// it can only show where the URL put it.
		secret := "Pw" + fuzzed + "Z9"
		inURL := secret
		if escape {
			inURL = url.QueryEscape(secret)
		}
		forms := []string{secret, url.QueryEscape(secret), url.PathEscape(secret),
			strings.TrimPrefix(url.UserPassword("u", secret).String(), "u:")}
		check := func(what, text, raw string) {
			t.Helper()
			for _, s := range forms {
				require.NotContains(t, text, s, "%s of %q shows its secret", what, raw)
			}
		}
		raw := fmt.Sprintf(urlShapes[int(shape)%len(urlShapes)], fuzzSchemes[int(scheme)%len(fuzzSchemes)], inURL)
		check("Redact", storeurl.Redact(raw), raw)

		ctx := context.Background()
		for _, opts := range []storeurl.Options{{}, {Password: storeurl.Secret{Value: secret}, Token: storeurl.Secret{Value: secret}}} {
			d, err := storeurl.Open(ctx, raw, opts)
			if err != nil {
				check("the error of Open", err.Error(), raw)
				check("the error of Open", fmt.Sprintf("%+v %#v", err, err), raw)
				continue
			}
			check("the description", d.Info().Description, raw)
			require.NoError(t, d.Close())
		}

		// What a driver gets prints redacted.
		cfgs = nil
		fake := "fake://" + raw
		if i := strings.Index(raw, "://"); i >= 0 {
			fake = "fake" + raw[i:]
		}
		d, err := m.Open(ctx, fake, storeurl.Options{Password: storeurl.Secret{Value: secret}})
		if err != nil {
			check("the error of Open", err.Error(), fake)
			return
		}
		defer d.Close()
		require.Len(t, cfgs, 1)
		var logged bytes.Buffer
		slog.New(slog.NewTextHandler(&logged, nil)).Info("opened", "store", cfgs[0])
		check("fmt of the Config", fmt.Sprintf("%v %+v %#v %s", cfgs[0], cfgs[0], cfgs[0], cfgs[0].Redacted()), fake)
		check("log/slog of the Config", logged.String(), fake)
	})
}
