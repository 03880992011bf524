package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/internal/freeport"
)

// defaultStoreRun is a job of several `spate backfill` workers on the
// default store: the first hosts the embedded etcd, the others join it.
type defaultStoreRun struct {
	t        *testing.T
	dir      string
	src, dst string
	lines    int
	addr     string
	args     []string // every worker's flags, but --instance
	workers  []*proc
}

// storeHostLease is the workers' --lease: the default store's floor. Every
// wait of these tests derives from it.
const storeHostLease = 2 * time.Second

func newDefaultStoreRun(t *testing.T, files, linesPerFile int, rate string, extra ...string) *defaultStoreRun {
	dir := t.TempDir()
	r := &defaultStoreRun{t: t, dir: dir, src: filepath.Join(dir, "src"), dst: filepath.Join(dir, "dst"),
		addr: "127.0.0.1:" + strconv.Itoa(freeport.WithOffset(t, 10))}
	r.lines = writeCorpus(t, r.src, files, linesPerFile)
	r.args = append([]string{"backfill", "--src", r.src, "--dst", r.dst, "--job", "hostjob",
		"--data-dir", filepath.Join(dir, ".spate", "etcd"), "--embed-addr", r.addr, "--lease", storeHostLease.String(),
		"--commit-interval", "200ms", "--split-bytes", "16384", "--split-files", "1", "--lanes", "2", "--rate", rate}, extra...)
	return r
}

// start starts a worker with instance id and waits until it reached the
// store: hosting it (host) or joined to it.
func (r *defaultStoreRun) start(id string, host bool) *proc {
	p := start(r.t, r.dir, "", append(r.args, "--instance", id)...)
	want := "hosted by another spate process"
	if host {
		want = "hosted by this process"
	}
	p.stdout.waitFor(r.t, p, want, 30*storeHostLease)
	r.workers = append(r.workers, p)
	return p
}

// verify runs spate verify over the output: every input line exactly once.
// killHostUnderWork starts the host w0 and two workers, w1 and w2, waits
// until both hold splits, SIGKILLs the host and waits until both say the
// store is gone. It returns the host's pid and the two survivors.
func (r *defaultStoreRun) killHostUnderWork() (hostPID int, survivors []*proc) {
	t := r.t
	host := r.start("w0", true)
	survivors = []*proc{r.start("w1", false), r.start("w2", false)}
	for _, s := range survivors {
		s.stdout.waitFor(t, s, "gained ", 30*storeHostLease)
	}
	hostPID = host.cmd.Process.Pid
	require.NoError(t, host.cmd.Process.Kill())
	<-host.done
	for _, s := range survivors {
		s.stderr.waitFor(t, s, `msg="the default store is gone`, 30*storeHostLease)
	}
	return hostPID, survivors
}

func (r *defaultStoreRun) verify() {
	code, out, errOut := runSpate(r.t, r.dir, "", 30*storeHostLease, "verify", "--src", r.src, "--dst", r.dst)
	expectCode(r.t, "verify", code, 0, out, errOut)
	require.Contains(r.t, out, "exactly once: all "+count(int64(r.lines))+" input lines", "verify:\n%s", out)
}

// storeGoneLine is the ERROR line a worker logs when the default store's
// host is gone.
var storeGoneLine = regexp.MustCompile(`(?m)^.*level=ERROR msg="the default store is gone.*$`)

// The worker that hosts the default store is SIGKILLed mid-job. Each
// survivor says so within a lease in one ERROR line, naming the store's
// address, the process that hosted it and the command that brings it
// back. One is then interrupted (SIGINT): it does not claim the job goes
// on without it, it exits 1 with the truth. The other, as nobody brings
// the store back, exits 1 once --connect-timeout has passed, saying why.
func TestDefaultStoreHostKilledSurvivorsSayItAndExit(t *testing.T) {
	t.Parallel()
	const wait = 5 * storeHostLease // --connect-timeout: how long the survivors wait for the store
	r := newDefaultStoreRun(t, 12, 3000, "1000", "--connect-timeout", wait.String())
	hostPID, survivors := r.killHostUnderWork()

	for _, s := range survivors {
		line := storeGoneLine.FindString(s.stderr.String())
		for _, want := range []string{
			"store=\"embedded etcd at " + r.addr + "\"",            // which store
			fmt.Sprintf("pid %d on host", hostPID),                 // which process hosted it
			"worker w0",                                            // and its worker
			"data_dir=" + filepath.Join(r.dir, ".spate", "etcd"),   // where its data is
			"--data-dir " + filepath.Join(r.dir, ".spate", "etcd"), // what to run
			"exits_in=" + wait.String(),
		} {
			assert.Contains(t, line, want, "the ERROR line lacks %q:\n%s", want, line)
		}
	}

	// SIGINT while the store is gone: no "the job goes on", exit 1.
	interrupted, waiting := survivors[0], survivors[1]
	require.NoError(t, interrupted.cmd.Process.Signal(os.Interrupt))
	code := interrupted.wait(t, wait+30*storeHostLease)
	out := interrupted.stdout.String()
	expectCode(t, "the survivor interrupted while the store is gone", code, exitFailed, out, interrupted.stderr.String())
	assert.NotContains(t, out, "the job goes on", "an interrupted survivor claims the job goes on without the store:\n%s", out)
	assert.Contains(t, out, "FAILED", out)
	assert.Contains(t, out, "the default store (embedded etcd at "+r.addr, out)

	// Nobody brings the store back: the other exits 1 after the wait.
	code = waiting.wait(t, wait+30*storeHostLease)
	out = waiting.stdout.String()
	expectCode(t, "the survivor nobody brought the store back for", code, exitFailed, out, waiting.stderr.String())
	assert.Contains(t, out, "nobody brought it back within "+wait.String(), out)
	assert.Contains(t, out, "--data-dir "+filepath.Join(r.dir, ".spate", "etcd"), out)
	for _, s := range survivors {
		assert.Len(t, storeGoneLine.FindAllString(s.stderr.String(), -1), 1, "not one ERROR line:\n%s", s.stderr.String())
	}
}

// The worker that hosts the default store is SIGKILLed mid-job, and a
// worker is restarted on the same --data-dir: it brings the store back
// from its data, the survivors say it is back and go on, and the job
// completes with every input line in the output exactly once.
func TestDefaultStoreHostKilledAndRestartedJobCompletes(t *testing.T) {
	t.Parallel()
	r := newDefaultStoreRun(t, 12, 3000, "1000")
	_, survivors := r.killHostUnderWork()

	restarted := r.start("w0", true)
	for _, s := range survivors {
		s.stderr.waitFor(t, s, "the default store is back", 30*storeHostLease)
	}
	for _, p := range append(survivors, restarted) {
		code := p.wait(t, 90*storeHostLease)
		expectCode(t, "worker", code, 0, p.stdout.String(), p.stderr.String())
		assert.Contains(t, p.stdout.String(), " complete\n", p.stdout.String())
	}
	r.verify()
}

// The worker that hosts the default store does not leave while another
// worker that uses it still runs, even one that has not seen the job end
// because it was frozen (SIGSTOP) past its lease, when its presence in the
// job expired: once thawed, it learns the verdict and every worker exits
// 0. Before, the host left as soon as no presence was left, and the thawed
// worker waited on a store that was gone, silently, for ever.
func TestDefaultStoreHostWaitsForEveryWorker(t *testing.T) {
	t.Parallel()
	r := newDefaultStoreRun(t, 6, 2000, "2000")
	host := r.start("w0", true)
	other := r.start("w1", false)
	frozen := r.start("w2", false)
	frozen.stdout.waitFor(t, frozen, "gained ", 30*storeHostLease)
	require.NoError(t, frozen.cmd.Process.Signal(syscall.SIGSTOP))
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			_ = frozen.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(thaw)

	// The others finish the job (the frozen worker's splits are taken over
	// once its leases end).
	code := other.wait(t, 90*storeHostLease)
	expectCode(t, "the other worker", code, 0, other.stdout.String(), other.stderr.String())
	host.stdout.waitFor(t, host, "summary: job", 30*storeHostLease)
	// The frozen worker's presence expires (its lease), and then some.
	time.Sleep(3 * storeHostLease)
	thaw()
	for _, p := range []*proc{frozen, host} {
		code := p.wait(t, 60*storeHostLease)
		expectCode(t, "worker", code, 0, p.stdout.String(), p.stderr.String())
	}
	assert.Contains(t, host.stdout.String(), "worker w2 (pid "+strconv.Itoa(frozen.cmd.Process.Pid)+")",
		"the host did not say which worker it waits for:\n%s", host.stdout.String())
	assert.NotContains(t, frozen.stderr.String(), "the default store is gone", frozen.stderr.String())
	r.verify()
}
