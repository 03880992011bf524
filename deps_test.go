package spate_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The root package is the seam: it must never depend on a driver or on a
// backend client, or every user would link every backend.
func TestRootImportsNoDriverOrBackend(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	require.NoError(t, err, "go list:\n%s", out)
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"/stores/", "go.etcd.io/", "github.com/nats-io/", "github.com/redis/", "/pipeline", "/conformance"} {
			assert.NotContains(t, dep, banned, "the root package depends on %s", dep)
		}
	}
}

// The conformance suite judges drivers, so it must not be built on one:
// a user's driver runs it without linking ours or their backend clients.
// Fault injection lives in faultstore, which is not a driver.
func TestConformanceImportsNoDriver(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "./conformance", "./faultstore").CombinedOutput()
	require.NoError(t, err, "go list:\n%s", out)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/spate-go/spate/conformance", "go list -deps ./conformance did not list the package itself:\n%s", out)
	for _, dep := range deps {
		for _, banned := range []string{"github.com/spate-go/spate/stores/", "go.etcd.io/", "github.com/nats-io/", "github.com/redis/"} {
			assert.False(t, strings.HasPrefix(dep, banned), "conformance or faultstore depends on %s", dep)
		}
	}
}

// The directory backfill must not drag the Go CDK into every pipeline user:
// only pipeline/filesource/blobsource imports it.
func TestFilesourceImportsNoCloudSDK(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "./pipeline", "./pipeline/filesource").CombinedOutput()
	require.NoError(t, err, "go list:\n%s", out)
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"gocloud.dev/", "github.com/aws/", "cloud.google.com/", "github.com/Azure/"} {
			assert.False(t, strings.HasPrefix(dep, banned), "pipeline or pipeline/filesource depends on %s", dep)
		}
	}
}
