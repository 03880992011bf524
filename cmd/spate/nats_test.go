package main

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/internal/natsservers"
)

// A backfill over NATS JetStream KV (an in-process nats-server with TLS and
// user/password auth): two runs, the second finding the job complete;
// inspect reads the job's lease from its bucket; conformance passes and
// deletes its buckets.
func TestNATSStore(t *testing.T) {
	t.Parallel()
	srv := natsservers.Start(t, natsservers.WithTLS(false), natsservers.WithUserPassword("spate", "s3cret"))
	storeArgs := []string{"--store", srv.URL, "--ca-file", srv.CAFile, "--user", "spate", "--password", "s3cret"}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	lines := writeCorpus(t, src, 6, 500)
	args := append([]string{"backfill", "--src", src, "--dst", filepath.Join(dir, "dst"), "--job", "natsjob",
		"--lease", "2s", "--split-bytes", "16384"}, storeArgs...)
	code, out, errOut := runSpate(t, dir, "", 90*time.Second, args...)
	expectCode(t, "backfill over nats", code, 0, out, errOut)
	require.Contains(t, out, "verified exactly once: all "+count(int64(lines))+" input lines", "not verified:\n%s", out)
	code, out, errOut = runSpate(t, dir, "", 60*time.Second, args...)
	expectCode(t, "second backfill over nats", code, 0, out, errOut)
	require.Contains(t, out, "is already complete", "the second run did not find the job complete:\n%s", out)
	// inspect opens the job with its recorded lease (2s), not its default.
	in := inspectJSON(t, dir, append([]string{"--job", "natsjob"}, storeArgs...))
	require.Equal(t, "complete", in.Summary.State, "inspect over nats: %+v", in.Summary)
	require.NotZero(t, in.Summary.Completed, "inspect over nats: %+v", in.Summary)

	// A slice of the store rules: every one of them runs on the same kind
	// of server (natsservers) in stores/nats's TestStoreConformance, in
	// process; what this adds is the command around them over TLS with a
	// user and password (the URL and flags, the table, the skips, the
	// exit code, the clean-up). The whole suite took most of this test's
	// 36 s (-race, CI's -parallel 4). A rule of each capability NATS
	// lacks shows its skip.
	slice := []string{"DriverIsNamed", "RequiredSettingsAreMet", "TTLIsFixedWhenOpened", "ValuesRoundTrip",
		"UpdateIsCompareAndSwap", "WatchDeliversDeletes", "WatchPutCarriesItsWrite", "ExpiredKeysReadAbsentAndAreRecreatable"}
	skips := []string{"ReleaseUpdatesAndDeletes", "SessionKeysLiveWhileKeptAlive"}
	code, out, errOut = runSpate(t, dir, "", 5*time.Minute, append([]string{"conformance", "--ttl", "2s",
		"--run", "^Store/(" + strings.Join(append(slices.Clone(slice), skips...), "|") + ")$"}, storeArgs...)...)
	expectCode(t, "conformance on nats", code, 0, out, errOut)
	for _, rule := range slice {
		require.Regexp(t, regexp.MustCompile(`(?m)^Store/`+rule+`\s+PASS\s`), out, "no PASS row for Store/%s:\n%s", rule, out)
	}
	// The one-call release and sessions skip: NATS has no write that
	// spans its two buckets and no shared lifetime for keys.
	for _, rule := range skips {
		require.Regexp(t, regexp.MustCompile(`(?m)^Store/`+rule+`\s+SKIP\s`), out, "no SKIP row for Store/%s:\n%s", rule, out)
		assert.Contains(t, []string{"spate.Releaser", "spate.Sessioner"}, capabilityOf(rule), "rule %s", rule)
	}
	n := len(slice) + len(skips)
	require.Contains(t, out, fmt.Sprintf("%d rules: %d passed, 0 failed, %d skipped", n, len(slice), len(skips)), "want %d store rules:\n%s", n, out)
	// Only the backfill's job is left: the suite deleted its buckets.
	code, out, errOut = runSpate(t, dir, "", 60*time.Second, append([]string{"inspect"}, storeArgs...)...)
	expectCode(t, "inspect without --job", code, 0, out, errOut)
	require.Contains(t, out, "job       natsjob", "inspect did not find the only job left:\n%s", out)
}

// A NATS server that refuses the client's credentials fails the
// conformance preflight clearly.
func TestConformanceOnNATSWithWrongCredentials(t *testing.T) {
	t.Parallel()
	srv := natsservers.Start(t, natsservers.WithToken("right-token"))
	code, out, errOut := runSpate(t, t.TempDir(), "", 2*time.Minute, "conformance", "--store", srv.URL, "--token", "wrong-token",
		"--connect-timeout", "1s")
	expectCode(t, "conformance with a wrong token", code, exitFailed, out, errOut)
	for _, want := range []string{"Preflight/StoreOpens  FAIL", "authentication failed", "FAIL: the store refuses"} {
		require.Contains(t, out, want, "output lacks %q:\n%s", want, out)
	}
}
