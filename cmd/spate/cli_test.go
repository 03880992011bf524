package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/internal/etcdservers"
	"github.com/spate-go/spate/internal/freeport"
	"github.com/spate-go/spate/internal/redisservers"
	"github.com/spate-go/spate/pipeline/filesource"
	"github.com/spate-go/spate/stores/etcd"
)

// A backfill over the default store (an embedded etcd it starts) is
// stopped with SIGINT (Ctrl-C) mid-run: it hands its splits back, prints
// its summary and exits 130. The next run is two processes: the first starts
// the embedded store again, the second joins it on the port; together they
// resume the job and finish it, and the output verifies. A third run says
// the job is complete. Along the way: metrics and health endpoints, and the
// --history file's JSON lines (gains, commits, durable writes, hand-backs),
// checked for the commit invariant: no watermark passes output that was not
// yet durable.
func TestBackfillOverEmbeddedEtcdResumesAfterSIGINT(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	lines := writeCorpus(t, src, 24, 2500)
	port := freeport.WithOffset(t, 10)
	common := []string{"backfill", "--src", src, "--dst", dst, "--data-dir", filepath.Join(dir, ".spate", "etcd"),
		"--embed-addr", "127.0.0.1:" + strconv.Itoa(port), "--lease", "2s", "--split-bytes", "65536", "--split-files", "2",
		"--commit-interval", "200ms", "--lanes", "4"}
	hist1 := filepath.Join(dir, "run1.jsonl")

	// Run 1: slow, interrupted once it has completed a split.
	run1 := start(t, dir, "", append(common, "--rate", "6000", "--history", hist1, "--metrics-addr", "127.0.0.1:0")...)
	run1.stdout.waitFor(t, run1, "metrics: http://", 60*time.Second)
	addr := regexp.MustCompile(`metrics: http://(\S+)/metrics`).FindStringSubmatch(run1.stdout.String())[1]
	run1.stdout.waitFor(t, run1, "completed f1", 60*time.Second)
	for path, want := range map[string]string{"/metrics": "spate_coordination_", "/healthz": "ok", "/readyz": "ok"} {
		body := httpGet(t, "http://"+addr+path)
		require.Contains(t, body, want, "GET %s: no %q in:\n%.2000s", path, want, body)
	}
	body := httpGet(t, "http://"+addr+"/metrics")
	require.Contains(t, body, "spate_pipeline_", "/metrics has no pipeline series")
	// Every series the Grafana dashboard in docs/ queries is one a worker
	// serves.
	dash, err := os.ReadFile("../../docs/grafana/spate-job.json")
	require.NoError(t, err)
	queried := map[string]bool{}
	for _, m := range regexp.MustCompile(`spate_[a-z_]+`).FindAllString(string(dash), -1) {
		for _, suffix := range []string{"_bucket", "_count", "_sum"} {
			m = strings.TrimSuffix(m, suffix)
		}
		queried[m] = true
	}
	require.GreaterOrEqual(t, len(queried), 10, "the dashboard queries %d series: not the dashboard this test knows", len(queried))
	for m := range queried {
		assert.Contains(t, body, "# TYPE "+m+" ", "the Grafana dashboard queries %s, which /metrics does not serve", m)
	}
	// The job view at /ui on the same address: the jobs list names this
	// job, and its page lists the splits with the completed one.
	list := httpGet(t, "http://"+addr+"/ui/")
	jobPath := regexp.MustCompile(`href="(/ui/jobs/[^"]+)"`).FindStringSubmatch(list)
	require.NotNil(t, jobPath, "GET /ui/: no job link in:\n%.2000s", list)
	page := httpGet(t, "http://"+addr+jobPath[1])
	require.Contains(t, page, "f1", "GET %s: no split rows in:\n%.3000s", jobPath[1], page)
	require.Contains(t, page, "completed", "GET %s: no split rows in:\n%.3000s", jobPath[1], page)
	require.NoError(t, run1.cmd.Process.Signal(os.Interrupt))
	code := run1.wait(t, 60*time.Second)
	out1 := run1.stdout.String()
	expectCode(t, "run 1 (SIGINT)", code, 130, out1, run1.stderr.String())
	for _, want := range []string{"stopping gracefully", "summary: job", "interrupted"} {
		require.Contains(t, out1, want, "run 1 output lacks %q:\n%s", want, out1)
	}

	// Run 2: a host (starts the embedded store from its data) and a joiner
	// (finds it on the port).
	host := start(t, dir, "", append(common, "--rate", "8000", "--history", filepath.Join(dir, "run2-host.jsonl"))...)
	host.stdout.waitFor(t, host, "hosted by this process", 60*time.Second)
	joiner := start(t, dir, "", append(common, "--rate", "8000")...)
	joinerCode := joiner.wait(t, 90*time.Second)
	hostCode := host.wait(t, 90*time.Second)
	jout, hout := joiner.stdout.String(), host.stdout.String()
	expectCode(t, "run 2 joiner", joinerCode, 0, jout, joiner.stderr.String())
	expectCode(t, "run 2 host", hostCode, 0, hout, host.stderr.String())
	require.Contains(t, jout, "hosted by another spate process", "the second process did not join the running embedded store:\n%s", jout)
	m := regexp.MustCompile(`resuming job: (\d+) of (\d+) splits completed`).FindStringSubmatch(hout)
	require.NotNil(t, m, "run 2 did not resume a partly completed job:\n%s", hout)
	require.NotEqual(t, "0", m[1], "run 2 did not resume a partly completed job:\n%s", hout)
	for _, out := range []string{hout, jout} {
		require.Contains(t, out, "summary: job", "run 2 did not complete and verify:\n%s", out)
		require.Contains(t, out, " complete\n", "run 2 did not complete and verify:\n%s", out)
		require.Contains(t, out, "verified exactly once: all "+count(int64(lines))+" input lines", "run 2 did not complete and verify:\n%s", out)
	}

	// Run 3: nothing to do.
	code, out3, err3 := runSpate(t, dir, "", 60*time.Second, common...)
	expectCode(t, "run 3", code, 0, out3, err3)
	require.Contains(t, out3, "is already complete", "run 3 did not say the job is complete:\n%s", out3)

	// The verifier agrees on its own.
	code, vout, verr := runSpate(t, dir, "", 60*time.Second, "verify", "--src", src, "--dst", dst)
	expectCode(t, "verify", code, 0, vout, verr)

	checkHistory(t, hist1, 130)
}

// checkHistory parses a --history file: every line is a JSON object with ts,
// instance and ev; the run gained, committed and wrote durably; every won
// commit's watermark is covered by durable output of its tenancy recorded
// before it (a commit never passes undurable data); and by the exit every
// tenancy gained has ended: completed, handed back or lost (a graceful stop
// leaves nothing held).
func checkHistory(t *testing.T, path string, exitCode int) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	type key struct {
		split string
		epoch uint64
	}
	durableTo := map[key]int64{} // highest durable offset per tenancy
	resume := map[key]int64{}
	open := map[string]uint64{} // split -> epoch of a tenancy not yet ended
	seen := map[string]int{}
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		n++
		var ev struct {
			TS        string `json:"ts"`
			Instance  string `json:"instance"`
			Ev        string `json:"ev"`
			Split     string `json:"split"`
			Epoch     uint64 `json:"epoch"`
			Watermark int64  `json:"watermark"`
			Last      int64  `json:"last"`
			Resume    *int64 `json:"resume"`
			Completed bool   `json:"completed"`
			Outcome   string `json:"outcome"`
			Code      int    `json:"code"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &ev), "history line %d is not JSON: %s", n, sc.Text())
		require.NotEmpty(t, ev.TS, "history line %d lacks ts, instance or ev: %s", n, sc.Text())
		require.NotEmpty(t, ev.Instance, "history line %d lacks ts, instance or ev: %s", n, sc.Text())
		require.NotEmpty(t, ev.Ev, "history line %d lacks ts, instance or ev: %s", n, sc.Text())
		seen[ev.Ev]++
		k := key{ev.Split, ev.Epoch}
		switch ev.Ev {
		case "gained":
			if ev.Resume != nil {
				resume[k] = *ev.Resume
			}
			open[ev.Split] = ev.Epoch
		case "release", "release_drained", "lost", "quarantined":
			if ev.Outcome == "" || ev.Outcome == "ok" {
				delete(open, ev.Split)
			}
		case "durable":
			durableTo[k] = max(durableTo[k], ev.Last)
		case "commit":
			if ev.Outcome == "ok" && ev.Completed {
				delete(open, ev.Split)
			}
			if ev.Outcome == "ok" && ev.Watermark > resume[k] {
				require.GreaterOrEqual(t, durableTo[k], ev.Watermark-1,
					"history line %d: commit of %s epoch %d at watermark %d, but the tenancy's durable output only reached offset %d",
					n, ev.Split, ev.Epoch, ev.Watermark, durableTo[k])
			}
		case "exit":
			require.Equal(t, exitCode, ev.Code, "history records exit code %d, want %d", ev.Code, exitCode)
		}
	}
	for _, ev := range []string{"start", "gained", "open", "commit", "durable", "exit"} {
		require.NotZero(t, seen[ev], "history %s has no %q event (saw %v)", path, ev, seen)
	}
	require.Empty(t, open, "history %s: tenancies still held at the exit (split -> epoch): %v (saw %v)", path, open, seen)
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err, "GET %s", url)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode, "GET %s: %s: %s", url, resp.Status, b)
	return string(b)
}

// SIGTERM drains gracefully: exit 143 after the final commit, the
// hand-back and the summary, with no lease left behind; the next run (over
// the same external etcd) finishes the job and replays nothing.
func TestBackfillSIGTERMDrainsAndHandsBack(t *testing.T) {
	t.Parallel()
	cluster := etcdservers.Start(t, etcdservers.Options{})
	storeURL := "etcd://" + cluster.Members()[0].ClientURL.Host
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	lines := writeCorpus(t, src, 12, 2000)
	args := []string{"backfill", "--src", src, "--dst", dst, "--store", storeURL, "--job", "term", "--lease", "2s",
		"--split-bytes", "32768", "--commit-interval", "200ms", "--instance", "stable-1"}
	hist := filepath.Join(dir, "term.jsonl")
	p := start(t, dir, "", append(args, "--rate", "4000", "--history", hist)...)
	p.stdout.waitFor(t, p, "completed f1", 60*time.Second)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	code := p.wait(t, 60*time.Second)
	out := p.stdout.String()
	expectCode(t, "SIGTERM run", code, 143, out, p.stderr.String())
	require.Contains(t, out, "interrupted (terminated)", "no graceful stop:\n%s", out)
	checkHistory(t, hist, 143)
	// Everything handed back: no lease of ours is left, so the next run
	// (same instance id) starts at once.
	st := openEtcdJob(t, cluster, "term", 2*time.Second)
	js, err := spate.InspectJob(ctxT(t, 10*time.Second), st, "")
	require.NoError(t, err)
	for _, s := range js.Splits {
		require.Empty(t, s.LeaseOwner, "split %s still leased by %s after the graceful stop", s.ID, s.LeaseOwner)
	}
	code, out, errOut := runSpate(t, dir, "", 90*time.Second, args...)
	expectCode(t, "second run", code, 0, out, errOut)
	require.Contains(t, out, "verified exactly once: all "+count(int64(lines))+" input lines", "the second run did not verify:\n%s", out)
	require.Contains(t, out, ", 0 duplicates",
		"rule: a resume after a graceful stop replays nothing (the final commit lands before the splits are handed back):\n%s", out)
}

// openEtcdJob opens a store over a job's prefix on a test cluster.
func openEtcdJob(t *testing.T, c *etcdservers.Cluster, job string, ttl time.Duration) spate.Store {
	t.Helper()
	cli := c.Client(t, nil)
	st, err := etcd.New(ctxT(t, 20*time.Second), cli, etcd.Options{Prefix: etcdPrefix(job), TTL: ttl})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// A split whose input was truncated after planning is poison: the file
// source fails it, it is quarantined at --max-attempts, and the job stalls
// (exit 3, with the inspect and requeue commands to run). spate inspect
// shows the quarantined split; requeue refuses without confirmation, and
// with it puts the split back (epoch bumped, attempts reset); once the file
// is restored, backfill finishes the job.
func TestQuarantinedSplitInspectAndRequeue(t *testing.T) {
	t.Parallel()
	cluster := etcdservers.Start(t, etcdservers.Options{})
	storeURL := "etcd://" + cluster.Members()[0].ClientURL.Host
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	lines := writeCorpus(t, src, 6, 300)
	const job = "poison"
	// One file (about 11 KiB) a split: a larger file would be divided
	// into ranges, each of which the damage below sets aside.
	popts := filesource.PlannerOptions{TargetBytes: 16384, MaxFiles: 1}
	storeArgs := []string{"--store", storeURL, "--job", job}
	args := append([]string{"backfill", "--src", src, "--dst", dst, "--lease", "2s", "--max-attempts", "2",
		"--split-bytes", "16384", "--split-files", "1"}, storeArgs...)

	// Plan the job (as its first worker's leader would), then damage one
	// planned file: it is now shorter than the plan says.
	st := openEtcdJob(t, cluster, job, 2*time.Second)
	planJob(t, st, filesource.NewPlanner(filesource.Dir(src), popts))
	victim := filepath.Join(src, "part-1", "f04.txt")
	orig, err := os.ReadFile(victim)
	require.NoError(t, err)
	require.NoError(t, os.Truncate(victim, int64(len(orig)/2)))

	code, out, errOut := runSpate(t, dir, "", 90*time.Second, args...)
	expectCode(t, "backfill over a damaged file", code, exitStalled, out, errOut)
	for _, want := range []string{"QUARANTINED", "part-1/f04.txt", "spate inspect", "spate requeue SPLIT"} {
		require.Contains(t, out, want, "the stalled run's output lacks %q:\n%s", want, out)
	}

	q := inspectJSON(t, dir, storeArgs)
	require.Equal(t, "stalled", q.Summary.State, "inspect: want 1 quarantined split and the rest completed, got %+v", q.Summary)
	require.Equal(t, 1, q.Summary.Quarantined, "inspect: want 1 quarantined split and the rest completed, got %+v", q.Summary)
	require.Equal(t, len(q.Splits)-1, q.Summary.Completed, "inspect: want 1 quarantined split and the rest completed, got %+v", q.Summary)
	var bad splitJSON
	for _, s := range q.Splits {
		if s.Status == string(spate.StatusQuarantined) {
			bad = s
		}
	}
	require.Equal(t, uint32(2), bad.Attempts, "the quarantined split has %d attempts, want 2 (--max-attempts)", bad.Attempts)
	require.Contains(t, bad.LastFailure, "the input changed since it was planned",
		"the quarantined split's record does not say why it was set aside: %q", bad.LastFailure)
	code, text, errOut := runSpate(t, dir, "", 60*time.Second, append([]string{"inspect"}, storeArgs...)...)
	expectCode(t, "inspect", code, 0, text, errOut)
	require.Regexp(t, regexp.MustCompile(bad.ID+`\s+quarantined\s`), text, "inspect's table does not show %s quarantined:\n%s", bad.ID, text)
	require.Contains(t, text, bad.ID+" after 2 attempts: "+bad.LastFailure, "inspect does not give the quarantine's reason:\n%s", text)

	// Requeue, declined.
	code, out, errOut = runSpate(t, dir, "n\n", 60*time.Second, append([]string{"requeue", bad.ID}, storeArgs...)...)
	expectCode(t, "requeue answered no", code, exitFailed, out, errOut)
	require.Contains(t, out, "[y/N]", "requeue did not ask, or did not take no for an answer:\n%s", out)
	require.Contains(t, out, "not requeued", "requeue did not ask, or did not take no for an answer:\n%s", out)
	again := inspectJSON(t, dir, storeArgs)
	require.Equal(t, 1, again.Summary.Quarantined, "a declined requeue changed the job: %+v", again.Summary)

	// Fix the input, requeue, finish.
	require.NoError(t, os.WriteFile(victim, orig, 0o644))
	code, out, errOut = runSpate(t, dir, "y\n", 60*time.Second, append([]string{"requeue", bad.ID}, storeArgs...)...)
	expectCode(t, "requeue", code, 0, out, errOut)
	after := inspectJSON(t, dir, storeArgs)
	for _, s := range after.Splits {
		if s.ID == bad.ID {
			require.Equal(t, string(spate.StatusRunnable), s.Status, "after requeue: %+v, want runnable, 0 attempts, epoch %d", s, bad.Epoch+1)
			require.Zero(t, s.Attempts, "after requeue: %+v, want runnable, 0 attempts, epoch %d", s, bad.Epoch+1)
			require.Equal(t, bad.Epoch+1, s.Epoch, "after requeue: %+v, want runnable, 0 attempts, epoch %d", s, bad.Epoch+1)
		}
	}
	code, out, errOut = runSpate(t, dir, "", 90*time.Second, args...)
	expectCode(t, "backfill after the requeue", code, 0, out, errOut)
	require.Contains(t, out, "verified exactly once: all "+count(int64(lines))+" input lines",
		"the job did not finish and verify after the requeue:\n%s", out)
}

func inspectJSON(t *testing.T, dir string, storeArgs []string) inspection {
	t.Helper()
	code, out, errOut := runSpate(t, dir, "", 60*time.Second, append([]string{"inspect", "--json"}, storeArgs...)...)
	expectCode(t, "inspect --json", code, 0, out, errOut)
	var in inspection
	require.NoError(t, json.Unmarshal([]byte(out), &in), "inspect --json:\n%s", out)
	return in
}

// planJob runs one coordinator until the job's plan is recorded final, then
// closes it (handing back anything it claimed). It wakes on every durable
// write of the job.
func planJob(t *testing.T, st spate.Store, planner spate.SplitPlanner) {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	changes, err := st.Watch(ctx, spate.Durable, "")
	require.NoError(t, err)
	c, err := spate.NewStoreCoordinator(st, spate.Config{InstanceID: "planner", LeaseDuration: 2 * time.Second,
		OpTimeout: 200 * time.Millisecond, RebalanceDelay: spate.NoRebalanceDelay},
		spate.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	c.SetWaker(spate.InertWaker())
	require.NoError(t, c.Start(planner))
	defer c.Close()
	for {
		js, err := spate.InspectJob(ctx, st, "")
		if err == nil && js.Plan.Finality == spate.PlanFinal && uint64(len(js.Splits)) == js.Plan.Planned && js.Plan.Planned > 0 {
			return
		}
		_, ok := <-changes
		require.True(t, ok, "the plan was not recorded within 30s")
	}
}

// spate conformance passes against a healthy etcd (the store rules, and two
// coordinator scenarios through --coordinator --run) and cleans up its
// namespaces.
func TestConformancePassesAgainstEtcd(t *testing.T) {
	t.Parallel()
	cluster := etcdservers.Start(t, etcdservers.Options{})
	storeURL := "etcd://" + cluster.Members()[0].ClientURL.Host
	// The command's default --ttl (2s), as stores/etcd's suite runs: at 1s
	// a rule's ephemeral writes, spaced by a loaded machine (-race, four
	// tests at once), outlived the TTL (WatchKeysDeliversOnlyListedKeys:
	// update ephemeral "wko": won=false).
	//
	// A slice of the store rules: every one of them runs on the same
	// embedded etcd in stores/etcd's TestStoreConformance, in process; what
	// this adds is the command around them (the store's URL, the table,
	// the exit code, the clean-up), which a slice shows. The whole suite
	// here took 44 s, and its WatchHasNoGaps once missed ephemeral deletes
	// within its 10 s bound while this package's process tests loaded the
	// machine (an open defect, named in issue 47's note).
	slice := []string{"DriverIsNamed", "RequiredSettingsAreMet", "TTLIsFixedWhenOpened", "ValuesRoundTrip",
		"UpdateIsCompareAndSwap", "WatchDeliversDeletes", "WatchPutCarriesItsWrite", "ExpiredKeysReadAbsentAndAreRecreatable"}
	code, out, errOut := runSpate(t, t.TempDir(), "", 5*time.Minute, "conformance", "--store", storeURL,
		"--run", "^Store/("+strings.Join(slice, "|")+")$")
	expectCode(t, "conformance on etcd", code, 0, out, errOut)
	for _, rule := range slice {
		require.Regexp(t, regexp.MustCompile(`(?m)^Store/`+rule+`\s+PASS\s`), out, "no PASS row for Store/%s:\n%s", rule, out)
	}
	n := len(slice)
	require.Contains(t, out, fmt.Sprintf("%d rules: %d passed, 0 failed", n, n), "want %d passing store rules:\n%s", n, out)
	code, out, errOut = runSpate(t, t.TempDir(), "", 5*time.Minute, "conformance", "--store", storeURL,
		"--coordinator", "--run", "Coordinator/(FencedZombieCommitWritesNothing|PoisonSplitQuarantinesAtMaxAttempts)$")
	expectCode(t, "conformance --coordinator on etcd", code, 0, out, errOut)
	for _, rule := range []string{"FencedZombieCommitWritesNothing", "PoisonSplitQuarantinesAtMaxAttempts"} {
		require.Regexp(t, regexp.MustCompile(`(?m)^Coordinator/`+rule+`\s+PASS\s`), out, "no PASS row for Coordinator/%s:\n%s", rule, out)
	}
	cli := cluster.Client(t, nil)
	resp, err := cli.Get(ctxT(t, 10*time.Second), etcdJobRoot+"conformance-", clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Zero(t, resp.Count, "conformance left %d keys behind under %sconformance-", resp.Count, etcdJobRoot)
}

// spate conformance fails clearly against a Redis that refuses scripts
// (EVAL renamed away) and against one configured as an evicting cache, and
// passes against a healthy one, leaving no keys.
func TestConformanceOnRedis(t *testing.T) {
	t.Parallel()
	t.Run("EVALRenamed", func(t *testing.T) {
		t.Parallel()
		srv := redisservers.Start(t, redisservers.WithArgs("--rename-command", "EVAL", ""))
		code, out, errOut := runSpate(t, t.TempDir(), "", 2*time.Minute, "conformance", "--store", "redis://"+srv.Addr())
		expectCode(t, "conformance on a redis without EVAL", code, exitFailed, out, errOut)
		for _, want := range []string{"Preflight/StoreOpens  FAIL", "does not accept EVAL", "rename-command", "FAIL: the store refuses"} {
			require.Contains(t, out, want, "output lacks %q:\n%s", want, out)
		}
	})
	t.Run("EvictingCache", func(t *testing.T) {
		t.Parallel()
		srv := redisservers.Start(t, redisservers.WithArgs("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"))
		code, out, errOut := runSpate(t, t.TempDir(), "", 2*time.Minute, "conformance", "--store", "redis://"+srv.Addr())
		expectCode(t, "conformance on an evicting redis", code, exitFailed, out, errOut)
		for _, want := range []string{"Preflight/StoreOpens  FAIL", "maxmemory-policy allkeys-lru", "set maxmemory-policy to noeviction", "FAIL: the store refuses"} {
			require.Contains(t, out, want, "output lacks %q:\n%s", want, out)
		}
	})
	// A server without the append-only file runs the suite, and fails it
	// on the one rule it breaks, naming the setting (it printed PASS).
	t.Run("NoPersistence", func(t *testing.T) {
		t.Parallel()
		srv := redisservers.Start(t)
		code, out, errOut := runSpate(t, t.TempDir(), "", 3*time.Minute, "conformance", "--store", "redis://"+srv.Addr(), "--ttl", "1500ms",
			"--run", "RequiredSettingsAreMet|DriverIsNamed")
		expectCode(t, "conformance on redis without persistence", code, exitFailed, out, errOut)
		for _, want := range []string{"Store/RequiredSettingsAreMet", "FAIL", "appendonly yes (the server has appendonly no", "Store/DriverIsNamed"} {
			require.Contains(t, out, want, "output lacks %q:\n%s", want, out)
		}
	})
	t.Run("Healthy", func(t *testing.T) {
		t.Parallel()
		srv := redisservers.Start(t, redisservers.WithAOF())
		code, out, errOut := runSpate(t, t.TempDir(), "", 3*time.Minute, "conformance", "--store", "redis://"+srv.Addr(), "--ttl", "1500ms")
		expectCode(t, "conformance on redis", code, 0, out, errOut)
		// Redis has no shared lifetime for keys: the Sessioner rules skip.
		rules, skip := len(conformance.StoreRules), 0
		for _, r := range conformance.StoreRules {
			if r.Capability == "spate.Sessioner" {
				skip++
			}
		}
		want := fmt.Sprintf("%d rules: %d passed, 0 failed, %d skipped", rules, rules-skip, skip)
		require.Contains(t, out, want, "want %q:\n%s", want, out)
		n, err := srv.Client(t).DBSize(ctxT(t, 5*time.Second)).Result()
		require.NoError(t, err)
		require.Zero(t, n, "conformance left %d keys on the server", n)
	})
}

// A mem:// backfill runs in one process and verifies.
func TestBackfillMemStore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	lines := writeCorpus(t, src, 5, 400)
	code, out, errOut := runSpate(t, dir, "", 60*time.Second, "backfill", "--src", src, "--dst", filepath.Join(dir, "dst"),
		"--store", "mem://", "--lease", "1s", "--split-bytes", "8192")
	expectCode(t, "mem backfill", code, 0, out, errOut)
	require.Contains(t, out, "verified exactly once: all "+count(int64(lines))+" input lines", "not verified:\n%s", out)
}

// A bucket URL is a source like a directory: the Go CDK's file:// driver
// reads the same corpus, the run verifies against the bucket, and spate
// verify takes the URL too.
func TestBackfillFromABucketURL(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	lines := writeCorpus(t, src, 5, 400)
	srcURL := "file://" + filepath.ToSlash(src) + "?metadata=skip"
	dst := filepath.Join(dir, "dst")
	code, out, errOut := runSpate(t, dir, "", 60*time.Second, "backfill", "--src", srcURL, "--dst", dst,
		"--store", "mem://", "--lease", "1s", "--split-bytes", "8192")
	expectCode(t, "bucket backfill", code, 0, out, errOut)
	require.Contains(t, out, "verified exactly once: all "+count(int64(lines))+" input lines", "not verified:\n%s", out)
	code, out, errOut = runSpate(t, dir, "", 30*time.Second, "verify", "--src", srcURL, "--dst", dst)
	expectCode(t, "verify against the bucket", code, 0, out, errOut)
}

// A --dst that is out of space (its shard files are /dev/full, which
// fails every write with ENOSPC, so no real disk is filled) fails the
// backfill quickly with an error naming the destination, instead of
// retrying forever.
func TestBackfillOutOfSpaceFailsFast(t *testing.T) {
	t.Parallel()
	dir, src, dst := fullDst(t)
	began := time.Now()
	code, out, errOut := runSpate(t, dir, "", 30*time.Second, "backfill", "--src", src, "--dst", dst,
		"--store", "mem://", "--instance", "w1", "--lease", "1s", "--split-bytes", "8192", "--publish", "commit")
	took := time.Since(began)
	expectCode(t, "out-of-space backfill", code, exitFailed, out, errOut)
	all := out + errOut
	for _, want := range []string{"no space left on device", dst} {
		assert.Contains(t, all, want, "output does not mention %q:\nstdout:\n%s\nstderr:\n%s", want, out, errOut)
	}
	// About 1.5 s of write backoff, then the drain.
	require.LessOrEqual(t, took, 10*time.Second, "the backfill took %v to fail", took)
	t.Logf("failed in %v", took)
}

// SIGINT while the sink retries a full disk exits within a second or two
// (it took 14 s: the drain retried the writes until its deadline).
func TestBackfillOutOfSpaceSIGINTExitsPromptly(t *testing.T) {
	t.Parallel()
	dir, src, dst := fullDst(t)
	p := start(t, dir, "", "backfill", "--src", src, "--dst", dst,
		"--store", "mem://", "--instance", "w1", "--lease", "1s", "--split-bytes", "8192", "--publish", "commit")
	p.stderr.waitFor(t, p, "publishing committed output failed; it is retried", 20*time.Second)
	require.NoError(t, p.cmd.Process.Signal(os.Interrupt))
	signalled := time.Now()
	code := p.wait(t, 30*time.Second)
	took := time.Since(signalled)
	require.NotEqual(t, exitOK, code, "exit code 0 with a full --dst:\n%s\nstderr:\n%s", p.stdout.String(), p.stderr.String())
	require.LessOrEqual(t, took, 3*time.Second, "exit took %v after SIGINT:\n%s\nstderr:\n%s", took, p.stdout.String(), p.stderr.String())
	t.Logf("exit code %d %v after SIGINT", code, took)
}

// fullDst returns a test directory, a corpus under it, and a --dst whose
// published files (one per split of the job at --split-bytes 8192) are
// /dev/full, which fails every write with ENOSPC, so no real disk is
// filled. Lines are staged, committed, and fail to publish (by copy:
// --publish commit; whole publishing renames over the name).
func fullDst(t *testing.T) (dir, src, dst string) {
	t.Helper()
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	dir = t.TempDir()
	src = filepath.Join(dir, "src")
	writeCorpus(t, src, 3, 200)
	dst = filepath.Join(dir, "dst")
	require.NoError(t, os.MkdirAll(dst, 0o755))
	members, err := filesource.ListFiles(context.Background(), src)
	require.NoError(t, err)
	for _, group := range filesource.Pack(members, 8192, 16) {
		require.NoError(t, os.Symlink("/dev/full", filepath.Join(dst, filesource.SplitID(group).String()+".out")))
	}
	return dir, src, dst
}

// capabilityOf names the optional capability store rule name belongs to
// ("" for the contract every store keeps).
func capabilityOf(name string) string {
	for _, r := range conformance.StoreRules {
		if r.Name == name {
			return r.Capability
		}
	}
	return ""
}
