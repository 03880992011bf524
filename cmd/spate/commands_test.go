package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/internal/redisservers"
)

// Every command main dispatches on is run by this test: its --help, and
// one real invocation against a store another process can read (a Redis
// server the test starts). A command added to the list without an
// invocation here fails it; a flag clash (two flags of one name, as
// spate ui's --token-file and the store flags' once were) panics as the
// command builds its flag set, which --help does first.
func TestEveryCommandRuns(t *testing.T) {
	t.Parallel()
	srv := redisservers.Start(t, redisservers.WithAOF())
	store := "redis://" + srv.Addr()
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	lines := writeCorpus(t, src, 3, 50)
	const job = "every"
	storeArgs := []string{"--store", store, "--job", job}
	run := func(t *testing.T, stdin string, want int, args ...string) (string, string) {
		t.Helper()
		code, out, errOut := runSpate(t, dir, stdin, 2*time.Minute, args...)
		expectCode(t, "spate "+strings.Join(args, " "), code, want, out, errOut)
		return out, errOut
	}

	// In order: each may read what those before it did.
	invocations := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"backfill", func(t *testing.T) {
			out, _ := run(t, "", exitOK, append([]string{"backfill", "--src", src, "--dst", dst, "--lease", "2s", "--split-bytes", "2048"}, storeArgs...)...)
			require.Contains(t, out, "summary: job "+job+" complete")
			require.Contains(t, out, "verified exactly once: all "+count(int64(lines))+" input lines")
		}},
		{"verify", func(t *testing.T) {
			out, _ := run(t, "", exitOK, "verify", "--src", src, "--dst", dst)
			require.Contains(t, out, "verified exactly once: all "+count(int64(lines))+" input lines")
		}},
		{"jobs", func(t *testing.T) {
			out, _ := run(t, "", exitOK, "jobs", "--store", store, "--long")
			require.Regexp(t, `(?m)^`+job+`\s+complete\s`, out)
		}},
		{"inspect", func(t *testing.T) {
			out, _ := run(t, "", exitOK, append([]string{"inspect", "--json"}, storeArgs...)...)
			var in inspection
			require.NoError(t, json.Unmarshal([]byte(out), &in), out)
			require.Equal(t, "complete", in.Summary.State, out)
			require.NotEmpty(t, in.Splits)
		}},
		{"requeue", func(t *testing.T) {
			// Only a quarantined split goes back into play (a requeue
			// that does is TestQuarantinedSplitInspectAndRequeue's); a
			// completed one is refused, naming its state.
			in := inspectJSON(t, dir, storeArgs)
			id := in.Splits[0].ID
			_, errOut := run(t, "", exitFailed, append([]string{"requeue", id, "--yes"}, storeArgs...)...)
			require.Contains(t, errOut, "split "+id+" of job "+job+" is completed, not quarantined: nothing to requeue")
		}},
		{"ui", func(t *testing.T) {
			// The view's token (--ui-token-file) beside the store's
			// flags (--token-file among them).
			uiTok, storeTok := filepath.Join(dir, "ui-token"), filepath.Join(dir, "store-token")
			require.NoError(t, os.WriteFile(uiTok, []byte("view-s3cret\n"), 0o600))
			require.NoError(t, os.WriteFile(storeTok, []byte("store-s3cret\n"), 0o600))
			p := start(t, dir, "", "ui", "--store", store, "--token-file", storeTok, "--ui-token-file", uiTok, "--addr", "127.0.0.1:0")
			p.stderr.waitFor(t, p, "spate ui: the jobs on ", time.Minute)
			m := regexp.MustCompile(`at (http://\S+)/\n`).FindStringSubmatch(p.stderr.String())
			require.NotNil(t, m, "no address in:\n%s", p.stderr.String())
			get := func(path, token string) (int, string) {
				req, err := http.NewRequest("GET", m[1]+path, nil)
				require.NoError(t, err)
				if token != "" {
					req.SetBasicAuth("", token)
				}
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				return resp.StatusCode, string(b)
			}
			code, _ := get("/", "")
			assert.Equal(t, http.StatusUnauthorized, code, "the view served without its token")
			code, _ = get("/", "store-s3cret")
			assert.Equal(t, http.StatusUnauthorized, code, "the view took the store's token for its own")
			code, body := get("/", "view-s3cret")
			require.Equal(t, http.StatusOK, code, body)
			require.Contains(t, body, `href="/jobs/`+job+`"`, "the jobs list does not link the job:\n%.2000s", body)
			code, body = get("/jobs/"+job, "view-s3cret")
			require.Equal(t, http.StatusOK, code, body)
			require.Contains(t, body, "complete", "the job's page does not show its state:\n%.3000s", body)
			require.NoError(t, p.cmd.Process.Signal(os.Interrupt))
			require.Equal(t, exitOK, p.wait(t, time.Minute), "spate ui after SIGINT:\n%s", p.stderr.String())
			assert.NotContains(t, p.stderr.String()+p.stdout.String(), "s3cret")
		}},
		{"conformance", func(t *testing.T) {
			out, _ := run(t, "", exitOK, "conformance", "--store", store, "--ttl", "1500ms", "--run", "DriverIsNamed")
			require.Regexp(t, `(?m)^Store/DriverIsNamed\s+PASS\s`, out)
		}},
		{"delete", func(t *testing.T) {
			out, _ := run(t, "", exitOK, append([]string{"delete", "--yes"}, storeArgs...)...)
			require.Contains(t, out, "deleted job "+job)
			out, errOut := run(t, "", exitOK, "jobs", "--store", store)
			require.Empty(t, out)
			require.Contains(t, errOut, "no jobs on redis://")
		}},
		{"demo", func(t *testing.T) {
			// The demo as a user first runs it, every flag at its
			// default, proves itself: exit 0, a takeover shown, every
			// line verified. (A smaller demo, --files 4, needs a lower
			// --rate: at the default 2,500 lines/s the victim's split can
			// be done within the first 500 ms commit, before the demo may
			// kill it, and the demo then fails with "the job finished
			// before the kill".)
			began := time.Now()
			out, _ := run(t, "", exitOK, "demo")
			t.Logf("spate demo took %v", time.Since(began).Round(100*time.Millisecond))
			for _, want := range []string{"SIGKILL worker-2", "TAKEOVER", "verified exactly once: all", "PASS"} {
				require.Contains(t, out, want, "demo output lacks %q:\n%s", want, out)
			}
		}},
	}

	var names, invoked []string
	for _, c := range commands {
		names = append(names, c.name)
	}
	for _, in := range invocations {
		invoked = append(invoked, in.name)
	}
	slices.Sort(names)
	slices.Sort(invoked)
	require.Equal(t, names, invoked, "every command main dispatches on needs its --help and a real invocation in this test")

	for _, c := range commands {
		t.Run(c.name+"/help", func(t *testing.T) {
			out, errOut := run(t, "", exitOK, c.name, "--help")
			require.True(t, strings.HasPrefix(out, "Usage: spate "+c.name+" "), "spate %s --help:\n%s", c.name, out)
			require.Contains(t, out, "\nFlags:\n")
			require.Empty(t, errOut)
		})
	}
	for _, in := range invocations {
		if !t.Run(in.name, in.run) {
			return // the rest read what it left
		}
	}
}
