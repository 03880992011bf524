package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/internal/etcdservers"
	"github.com/spate-go/spate/internal/natsservers"
	"github.com/spate-go/spate/internal/redisservers"
	"github.com/spate-go/spate/internal/s3test"
)

// Three `spate backfill` workers share one job; one is SIGKILLed mid-run
// (not restarted: the survivors take its splits over once its leases
// expire) and another SIGSTOPped past its lease, then SIGCONTed (a zombie
// whose late commits are fenced). On etcd, Redis and NATS, to a directory
// and to a bucket over the S3 wire protocol, `spate verify` then finds
// every input line exactly once: 0 missing, 0 duplicates. To a directory
// with --publish complete too: each split's file is published whole by
// renaming its staging file, and no staging file is left.
//
// CI runs each store once and each output at least once (processMatrix):
// etcd to a directory with --publish complete, Redis and NATS to a
// bucket; with TestFollowWorkersKilledAndStoppedAreExactlyOnce (etcd to a
// bucket, Redis to a directory, both publishing at each commit) every
// store × output pair of etcd and Redis runs once.
// SPATE_PROCESS_MATRIX=full runs all seven trials here.
func TestBackfillWorkersKilledAndStoppedAreExactlyOnce(t *testing.T) {
	t.Parallel()
	stores := storeCases("etcd", "redis", "nats")
	for _, st := range stores {
		for _, to := range []string{"dir", "dir+complete", "s3"} {
			name := st.name + "/" + to
			if to == "dir+complete" && st.name != "etcd" { // the store plays no part in how a file is published
				continue
			}
			if !processMatrix(name, "etcd/dir+complete", "redis/s3", "nats/s3") {
				continue
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel() // each run has its own server, input and output
				killStopTrial(t, st, to)
			})
		}
	}
}

// killStopTrial is one run of TestBackfillWorkersKilledAndStoppedAreExactlyOnce:
// three workers of one job on the store st, writing to to ("dir",
// "dir+complete": a directory with --publish complete, or "s3"), one
// SIGKILLed while it holds a split, another SIGSTOPped past its lease and
// SIGCONTed; both survivors must exit 0, and every input line be in the
// output exactly once.
func killStopTrial(t *testing.T, st storeCase, to string) {
	const lease = 2 * time.Second
	storeArgs := st.args(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	lines := writeCorpus(t, src, 12, 2500)
	dst := filepath.Join(dir, "dst")
	var publish []string
	switch to {
	case "s3":
		dst = s3test.Start(t).Bucket(t, "out", "")
	case "dir+complete":
		publish = []string{"--publish", "complete"}
	}
	job := "eo-" + st.name + "-" + strings.ReplaceAll(to, "+", "-")
	var ws []*proc
	for i := range 3 {
		args := append([]string{"backfill", "--src", src, "--dst", dst, "--job", job,
			"--instance", fmt.Sprintf("w%d", i), "--lease", lease.String(), "--commit-interval", "200ms",
			"--rate", "1500", "--split-bytes", "32768", "--verify=false"}, publish...)
		ws = append(ws, start(t, dir, "", append(args, storeArgs...)...))
	}
	t.Cleanup(func() {
		if t.Failed() { // the other workers' side of a failure
			for i, w := range ws {
				t.Logf("worker w%d stdout:\n%s\nstderr:\n%s", i, w.stdout.String(), w.stderr.String())
			}
		}
	})
	// The worker killed holds a split: it has gained one (and, at --rate
	// 1500, is still writing it).
	killed := ws[0]
	killed.stdout.waitFor(t, killed, "gained ", 2*time.Minute)
	require.NoError(t, killed.cmd.Process.Kill())
	<-killed.done
	// Stop a survivor still running (each must still exit 0 at the end:
	// one that ended early by a failure fails below).
	var stopped *proc
	for _, w := range ws[1:] {
		select {
		case <-w.done:
			t.Logf("worker exited before the stop:\nstdout:\n%s\nstderr:\n%s", w.stdout.String(), w.stderr.String())
			continue
		default:
		}
		if stopped == nil {
			stopped = w
		}
	}
	require.NotNil(t, stopped, "both survivors exited before the stop")
	require.NoError(t, stopped.cmd.Process.Signal(syscall.SIGSTOP))
	time.Sleep(lease + 1500*time.Millisecond)
	require.NoError(t, stopped.cmd.Process.Signal(syscall.SIGCONT))
	for _, w := range ws[1:] {
		code := w.wait(t, 3*time.Minute)
		expectCode(t, "worker", code, 0, w.stdout.String(), w.stderr.String())
	}
	// The faults took effect: a survivor gained a split at a later epoch
	// (a takeover; whether it resumed mid-split depends on the commits
	// made before the kill: a bucket's parts may not have rolled yet), and
	// the stopped worker came back to find splits it held taken over.
	require.Regexp(t, `gained \S+ \(epoch ([2-9]|[1-9][0-9]+)\)`, ws[1].stdout.String()+ws[2].stdout.String(), "no split was taken over")
	require.Contains(t, stopped.stdout.String(), "lost ", "the stopped worker lost nothing: it was not a zombie")
	code, out, errOut := runSpate(t, dir, "", time.Minute, "verify", "--src", src, "--dst", dst)
	t.Logf("%s -> %s: %s", st.name, to, strings.TrimSpace(out))
	expectCode(t, "verify", code, 0, out, errOut)
	require.Contains(t, out, "exactly once: all "+count(int64(lines))+" input lines")
	if to == "dir+complete" {
		var staged []string
		require.NoError(t, filepath.Walk(filepath.Join(dst, ".spate", "stage"), func(p string, info os.FileInfo, err error) error {
			if err == nil && !info.IsDir() && strings.HasSuffix(p, ".stage") {
				staged = append(staged, p)
			}
			return nil
		}))
		require.Empty(t, staged, "staging files left after the job completed")
	}
}

// processMatrix reports whether a process trial runs the store/output
// pair run: always when SPATE_PROCESS_MATRIX=full, else only the pairs
// given (ci). Each of those trials starts three spate processes and a
// server per pair for 15 to 45 s of the package's two cores; the pairs
// left out exercise the same store and the same output in another pair.
func processMatrix(run string, ci ...string) bool {
	return os.Getenv("SPATE_PROCESS_MATRIX") == "full" || slices.Contains(ci, run)
}

// storeCase is a live store a process test runs against: its name and
// the flags that reach it (the server started for the test).
type storeCase struct {
	name string
	args func(t *testing.T) []string
}

// storeCases are the named live stores, in the order named.
func storeCases(names ...string) []storeCase {
	all := map[string]func(t *testing.T) []string{
		"etcd": func(t *testing.T) []string {
			c := etcdservers.Start(t, etcdservers.Options{})
			return []string{"--store", "etcd://" + c.Members()[0].ClientURL.Host}
		},
		"redis": func(t *testing.T) []string {
			return []string{"--store", "redis://" + redisservers.Start(t, redisservers.WithAOF()).Addr()}
		},
		"nats": func(t *testing.T) []string {
			srv := natsservers.Start(t, natsservers.WithTLS(false))
			return []string{"--store", srv.URL, "--ca-file", srv.CAFile}
		},
	}
	var out []storeCase
	for _, n := range names {
		out = append(out, storeCase{name: n, args: all[n]})
	}
	return out
}
