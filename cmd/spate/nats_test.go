package main

import (
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/conformance"
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

	code, out, errOut = runSpate(t, dir, "", 5*time.Minute, append([]string{"conformance", "--ttl", "2s"}, storeArgs...)...)
	expectCode(t, "conformance on nats", code, 0, out, errOut)
	// Every store rule passes but those of the one-call release and of
	// sessions, which skip: NATS has no write that spans its two buckets
	// and no shared lifetime for keys.
	passed := regexp.MustCompile(`(?m)^Store/\S+\s+PASS\s`).FindAllString(out, -1)
	skipped := regexp.MustCompile(`(?m)^Store/(\S+)\s+SKIP\s`).FindAllStringSubmatch(out, -1)
	for _, m := range skipped {
		assert.Contains(t, []string{"spate.Releaser", "spate.Sessioner"}, capabilityOf(m[1]), "rule %s skipped on nats", m[1])
	}
	require.Equal(t, len(conformance.StoreRules), len(passed)+len(skipped),
		"want %d store rules passed or skipped (the Releaser and Sessioner rules skipped), got %d passed and %d skipped:\n%s",
		len(conformance.StoreRules), len(passed), len(skipped), out)
	require.NotEmpty(t, skipped,
		"want %d store rules passed or skipped (the Releaser and Sessioner rules skipped), got %d passed and %d skipped:\n%s",
		len(conformance.StoreRules), len(passed), len(skipped), out)
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
