package nats_test

import (
	"testing"

	"github.com/spate-go/spate/storeurl/storeurltest"
)

// A secret in a URL of this driver's schemes never shows, whatever
// characters it holds: not redacted, not in an error, not in the
// description.
func TestURLSecretsHidden(t *testing.T) {
	t.Parallel()
	for _, scheme := range []string{"nats", "tls"} {
		t.Run(scheme, func(t *testing.T) { storeurltest.SecretsHidden(t, scheme) })
	}
}
