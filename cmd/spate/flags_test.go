package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
)

// Every bad flag is refused before anything is created: exit 2, and one
// line on stderr that names the flag (no help text, no doubled prefix, no
// internal config names). Neither --dst nor the default store's data
// directory exists afterwards.
func TestBackfillRejectsBadFlagsBeforeCreatingAnything(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	writeCorpus(t, src, 1, 10)
	dst := filepath.Join(dir, "dst")
	base := []string{"backfill", "--src", src, "--dst", dst, "--embed-addr", "127.0.0.1:1"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"missing src", []string{"backfill", "--dst", dst}, "--src is required"},
		{"missing dst", []string{"backfill", "--src", src}, "--dst is required"},
		{"positional", append(base, "extra"), `unexpected argument "extra"`},
		{"unknown flag", append(base, "--bogus"), "-bogus"},
		{"commit interval zero", append(base, "--commit-interval", "0s"), "--commit-interval 0s: must be positive"},
		{"connect timeout negative", append(base, "--connect-timeout", "-1s"), "--connect-timeout -1s: must be positive"},
		{"rate negative", append(base, "--rate", "-5"), "--rate -5:"},
		{"rate NaN", append(base, "--rate", "NaN"), "--rate NaN:"},
		{"split bytes zero", append(base, "--split-bytes", "0"), "--split-bytes 0: must be at least 1"},
		{"split files zero", append(base, "--split-files", "0"), "--split-files 0: must be at least 1"},
		{"commit interval beyond lease", append(base, "--lease", "2s", "--commit-interval", "10s"), "--commit-interval 10s is longer than --lease 2s"},
		{"lease below floor", append(base, "--store", "mem://", "--lease", "100ms"), "--lease 100ms: must be at least 300ms"},
		{"lease fraction on etcd", append(base, "--store", "etcd://127.0.0.1:1", "--lease", "1500ms"), "etcd leases are whole seconds"},
		{"lease below the embedded floor", append(base, "--lease", "1s"), "--lease 1s: the default store"},
		{"threads huge", append(base, "--threads", "100000"), "--threads 100000: must be between 1 and 256"},
		{"threads zero", append(base, "--threads", "0"), "--threads 0"},
		{"lanes zero", append(base, "--lanes", "0"), "--lanes 0: must be at least 1"},
		{"max attempts zero", append(base, "--max-attempts", "0"), "--max-attempts 0"},
		{"drain timeout zero", append(base, "--drain-timeout", "0s"), "--drain-timeout 0s"},
		{"roll size zero", append(base, "--roll-size", "0"), "--roll-size 0: must be positive"},
		{"roll interval zero", append(base, "--roll-interval", "0s"), "--roll-interval 0s"},
		{"rebalance delay negative", append(base, "--rebalance-delay", "-1s"), "--rebalance-delay -1s"},
		{"bad job", append(base, "--job", "a/b"), "--job"},
		{"bad instance", append(base, "--instance", "a b"), "--instance"},
		{"bad metrics addr", append(base, "--metrics-addr", "nope"), "--metrics-addr"},
		{"history dir missing", append(base, "--history", filepath.Join(dir, "absent", "h.jsonl")), "--history"},
		{"log format", append(base, "--log-format", "xml"), "--log-format"},
		{"log level", append(base, "--log-level", "loud"), "--log-level"},
		{"bad store", append(base, "--store", "bogus://x"), `unknown scheme "bogus"`},
		{"cert without key", append(base, "--store", "etcd://127.0.0.1:1", "--cert-file", "c.pem"), "--cert-file and --key-file"},
		{"src absent", []string{"backfill", "--src", filepath.Join(dir, "absent"), "--dst", dst}, "--src"},
		{"dst is a file", []string{"backfill", "--src", src, "--dst", filepath.Join(src, "part-0", "f00.txt"), "--store", "mem://"}, "--dst"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runSpate(t, dir, "", 30*time.Second, tc.args...)
			assert.Equal(t, exitUsage, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
			assert.Empty(t, out)
			lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
			require.Len(t, lines, 1, "want one line on stderr:\n%s", errOut)
			assert.Contains(t, lines[0], tc.want)
			assert.True(t, strings.HasPrefix(lines[0], "spate backfill: "), lines[0])
			assert.NotContains(t, lines[0], "spate: spate:")
			assert.NotContains(t, lines[0], "op_timeout")
			assert.NotContains(t, lines[0], "Usage:")
			assert.NoDirExists(t, dst)
			assert.NoDirExists(t, filepath.Join(dir, ".spate"))
		})
	}
}

// The coordinator's timings come from spate.TimingsForLease, the flags set
// the rest.
func TestBackfillConfigDerivesFromTheLease(t *testing.T) {
	f := backfillFlags{lease: 4 * time.Second, maxAttempts: 3, lanes: 5}
	cfg := f.config("w-1")
	want := spate.TimingsForLease(4 * time.Second)
	assert.Equal(t, want.OpTimeout, cfg.OpTimeout)
	assert.Equal(t, want.ReplanInterval, cfg.ReplanInterval)
	assert.Equal(t, want.ReconcileInterval, cfg.ReconcileInterval)
	assert.Equal(t, want.DrainDeadline, cfg.DrainDeadline)
	assert.Equal(t, spate.NoRebalanceDelay, cfg.RebalanceDelay)
	assert.Equal(t, 3, cfg.MaxAttempts)
	assert.Equal(t, 5, cfg.MaxInFlight)
	require.NoError(t, cfg.Validate())
}
