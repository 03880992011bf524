package storeurltest

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/spate-go/spate/storeurl"
)

// secretShapes place a secret (%[2]s) in a URL of scheme %[1]s where a
// user may put one, escaped or not: a password holding a reserved
// character, a lone user name (a token), a list of servers, a query
// parameter.
var secretShapes = []string{
	"%[1]s://user:%[2]s@127.0.0.1:1",
	"%[1]s://%[2]s@127.0.0.1:1",
	"%[1]s://user:%[2]s@127.0.0.1:1/0",
	"%[1]s://user:%[2]s@127.0.0.1:notaport",
	"%[1]s://user:%[2]s@127.0.0.1:1,127.0.0.2:1",
	"%[1]s://user:%[2]s@127.0.0.1:1,%[1]s://user:%[2]s@127.0.0.2:1",
	"%[1]s://user:%[2]s@127.0.0.1:1?bogus=1",
	"%[1]s://127.0.0.1:1?password=%[2]s",
	"%[1]s://127.0.0.1:1/?token=%[2]s&bogus=1",
}

// secretValues hold each character that ends a URL's user info early
// when unescaped.
var secretValues = []string{"pa/ss-1", "pa?ss-2", "pa#ss-3", "pa@ss-4", "pa%ss-5", "pa:ss-6", "pa,ss-7", "p/a?s#s@w%o:r,d-8", "pa ss-9"}

// SecretsHidden opens URLs of scheme with a secret in every place a URL
// may carry one, unescaped and escaped, and fails t if the secret shows
// in the redacted URL, in the error of opening it, or in the
// description of the deployment it opened. It dials nothing.
func SecretsHidden(t *testing.T, scheme string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, secret := range secretValues {
		for _, inURL := range []string{secret, url.QueryEscape(secret)} {
			for _, shape := range secretShapes {
				raw := fmt.Sprintf(shape, scheme, inURL)
				shows := func(text string) bool {
					return strings.Contains(text, secret) || strings.Contains(text, inURL)
				}
				assert.False(t, shows(storeurl.Redact(raw)), "Redact(%q) = %q shows the secret", raw, storeurl.Redact(raw))
				d, err := storeurl.Open(ctx, raw, storeurl.Options{})
				if err != nil {
					assert.False(t, shows(err.Error()), "opening %q: the error shows the secret: %v", raw, err)
					continue
				}
				assert.False(t, shows(d.Info().Description), "opening %q: the description %q shows the secret", raw, d.Info().Description)
				_ = d.Close()
			}
		}
	}
}
