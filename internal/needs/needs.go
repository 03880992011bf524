// Package needs is the one rule for a test whose real tool or server
// (redis-server, PostgreSQL, logrotate, chromium) is missing from the
// machine: under CI=true the test fails, because CI installs every such
// tool and a missing one is a broken CI, not a pass; elsewhere it is
// skipped, loudly.
package needs

import (
	"os"
	"testing"
)

// Missing ends t for a missing tool; msg says what is missing and how to
// install it.
func Missing(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and %s", msg)
	}
	t.Skipf("SKIPPING REAL-SERVER TEST: %s", msg)
}
