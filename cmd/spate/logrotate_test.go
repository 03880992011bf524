package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/internal/needs"
)

// logrotateBin is Debian's logrotate (.ci/run installs it).
const logrotateBin = "/usr/sbin/logrotate"

// rotateTrial is the shape of a logrotate trial: SPATE_LOGROTATE_FULL=1
// runs the full form (3 minutes, a rotation every 15 s, 5 applications,
// a SIGKILL and a SIGSTOP past the lease); the default is CI's short form.
type rotateTrial struct {
	run, every time.Duration
	apps       []rotatedApp
	rate       int // lines per second per application
	stop       bool
}

type rotatedApp struct {
	name string
	conf string // its logrotate directives
	copy bool   // copytruncate: its lines in the copy→truncate window may be lost
}

func logrotateTrial() rotateTrial {
	if os.Getenv("SPATE_LOGROTATE_FULL") != "" {
		return rotateTrial{run: 3 * time.Minute, every: 15 * time.Second, rate: 200, stop: true, apps: []rotatedApp{
			{"app1", "copytruncate", true},
			{"app2", "copytruncate\n  compress\n  delaycompress", true},
			{"app3", "create", false},
			{"app4", "create", false},
			{"app5", "create\n  compress\n  delaycompress", false},
		}}
	}
	return rotateTrial{run: 24 * time.Second, every: 4 * time.Second, rate: 100, apps: []rotatedApp{
		{"app1", "copytruncate", true},
		{"app2", "create", false},
		{"app3", "create\n  compress\n  delaycompress", false},
	}}
}

// rotWriter is one application: it appends numbered lines to its log,
// one write per line, and reopens the log as soon as a rotation moved it
// (as an application told by logrotate's postrotate would).
type rotWriter struct {
	path string
	app  string
	f    *os.File
	n    int
}

func (w *rotWriter) write(t *testing.T, ledger *rotLedger) {
	if w.f != nil {
		fi, err1 := w.f.Stat()
		pi, err2 := os.Stat(w.path)
		if err1 != nil || err2 != nil || !os.SameFile(fi, pi) {
			w.f.Close()
			w.f = nil
		}
	}
	if w.f == nil {
		f, err := os.OpenFile(w.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		require.NoError(t, err)
		w.f = f
	}
	w.n++
	line := fmt.Sprintf("%s-%08d %s", w.app, w.n, strings.Repeat("z", w.n%30))
	_, err := w.f.WriteString(line + "\n")
	require.NoError(t, err)
	ledger.add(line, w.app)
}

// rotLedger is every line written, with its write time and application.
type rotLedger struct {
	mu      sync.Mutex
	written map[string]time.Time
	app     map[string]string
}

func (l *rotLedger) add(line, app string) {
	l.mu.Lock()
	l.written[line] = time.Now()
	l.app[line] = app
	l.mu.Unlock()
}

// window is one logrotate run: its start and end.
type window struct{ from, to time.Time }

// Real logrotate next to `spate backfill --follow`: applications append
// lines while logrotate rotates their logs (copytruncate; create; create
// with compress and delaycompress; rotate 3, the rotated files in the
// source directory, as logrotate leaves them by default), and three
// workers share the job, one SIGKILLed (and started again), in the full
// form one SIGSTOPped past its lease too. Every line written is counted in
// the output: none twice, no line that was never written (a compressed
// archive's bytes), and none missing but those a copytruncate application
// wrote while logrotate ran (its copy→truncate window). The latency from
// a line's write to its publication is logged, overall and for the lines
// written in the 2 s after a rotation of a `create` application.
func TestFollowNextToLogrotate(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(logrotateBin); err != nil {
		needs.Missing(t, logrotateBin+" is missing: install Debian's logrotate package (apt-get install logrotate; .ci/run does)")
	}
	tr := logrotateTrial()
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	require.NoError(t, os.MkdirAll(src, 0o755))
	var conf strings.Builder
	for _, a := range tr.apps {
		fmt.Fprintf(&conf, "%s {\n  rotate 3\n  missingok\n  notifempty\n  %s\n}\n", filepath.Join(src, a.name+".log"), a.conf)
	}
	confPath := filepath.Join(dir, "logrotate.conf")
	require.NoError(t, os.WriteFile(confPath, []byte(conf.String()), 0o644))
	statePath := filepath.Join(dir, "logrotate.state")

	ledger := &rotLedger{written: map[string]time.Time{}, app: map[string]string{}}
	writers := make([]*rotWriter, len(tr.apps))
	for i, a := range tr.apps {
		writers[i] = &rotWriter{path: filepath.Join(src, a.name+".log"), app: a.name}
		writers[i].write(t, ledger)
	}
	storeArgs := storeCases("etcd")[0].args(t)
	var started []*proc
	worker := func(i int) *proc {
		p := start(t, dir, "", append([]string{"backfill", "--follow", "--until-idle", "5s", "--log-level", "info",
			"--src", src, "--dst", dst, "--job", "logrotate", "--instance", fmt.Sprintf("w%d", i),
			"--lease", followLease.String()}, storeArgs...)...)
		started = append(started, p)
		return p
	}
	ws := []*proc{worker(0), worker(1), worker(2)}
	out := watchOutput(t, dst)

	// The applications write at tr.rate lines per second each.
	stopWriting := make(chan struct{})
	writing := make(chan struct{})
	go func() {
		defer close(writing)
		tick := time.NewTicker(time.Second / time.Duration(tr.rate))
		defer tick.Stop()
		for {
			select {
			case <-stopWriting:
				for _, w := range writers {
					if w.f != nil {
						w.f.Close()
					}
				}
				return
			case <-tick.C:
				for _, w := range writers {
					w.write(t, ledger)
				}
			}
		}
	}()

	var rotations []window
	killed, stopped := 0, 0
	end := time.Now().Add(tr.run)
	for i := 1; time.Now().Before(end); i++ {
		// Faults halfway between rotations: a worker killed right after a
		// copytruncate, before it committed what it read before the
		// truncation, leaves those lines to a copy that is not followed
		// (see the package documentation of filesource).
		time.Sleep(tr.every / 2)
		switch {
		case i == 2:
			k := i % len(ws)
			require.NoError(t, ws[k].cmd.Process.Kill())
			<-ws[k].done
			ws[k] = worker(k)
			killed++
		case i == 4 && tr.stop:
			k := i % len(ws)
			require.NoError(t, ws[k].cmd.Process.Signal(syscall.SIGSTOP))
			time.Sleep(followLease + 1500*time.Millisecond)
			require.NoError(t, ws[k].cmd.Process.Signal(syscall.SIGCONT))
			stopped++
		}
		time.Sleep(tr.every - tr.every/2)
		from := time.Now()
		cmd := exec.Command(logrotateBin, "-f", "-s", statePath, confPath)
		b, err := cmd.CombinedOutput()
		require.NoError(t, err, "logrotate: %s", b)
		rotations = append(rotations, window{from, time.Now()})
	}
	close(stopWriting)
	<-writing
	for _, w := range ws {
		code := w.wait(t, 3*time.Minute)
		expectCode(t, "worker", code, 0, w.stdout.String(), w.stderr.String())
	}
	out.close()
	require.Positive(t, killed, "no worker was killed")

	// Count every published line.
	published := map[string]int{}
	outs, err := filepath.Glob(filepath.Join(dst, "*.out"))
	require.NoError(t, err)
	for _, path := range outs {
		f, err := os.Open(path)
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			_, v, _ := strings.Cut(sc.Text(), "\t")
			published[v]++
		}
		require.NoError(t, sc.Err())
		f.Close()
	}
	copying := map[string]bool{}
	for _, a := range tr.apps {
		copying[a.name] = a.copy
	}
	// A copytruncate application's line is lost if it was written after
	// its lane's last read before the truncation: in logrotate's run, or
	// just before it (a lane looks for growth every 50ms).
	inWindow := func(at time.Time) bool {
		for _, w := range rotations {
			if !at.Before(w.from.Add(-100*time.Millisecond)) && !at.After(w.to) {
				return true
			}
		}
		return false
	}
	var dups, alien, lostInWindow int
	var lostOutside []string
	ledger.mu.Lock()
	for line, at := range ledger.written {
		switch n := published[line]; {
		case n > 1:
			dups += n - 1
		case n == 0 && copying[ledger.app[line]] && inWindow(at):
			lostInWindow++
		case n == 0:
			lostOutside = append(lostOutside, line)
		}
	}
	for v := range published {
		if _, ok := ledger.written[v]; !ok {
			alien++
		}
	}
	total := len(ledger.written)
	ledger.mu.Unlock()

	// Latency: overall, and of the lines written in the 2 s after a
	// rotation of a create application.
	all := latencies(&followInput{written: ledger.written}, out, time.Time{}, time.Now())
	var afterCreate []time.Duration
	ledger.mu.Lock()
	out.mu.Lock()
	for line, at := range ledger.written {
		if copying[ledger.app[line]] {
			continue
		}
		seen, ok := out.seen[line]
		if !ok {
			continue
		}
		for _, w := range rotations {
			if !at.Before(w.to) && at.Before(w.to.Add(2*time.Second)) {
				afterCreate = append(afterCreate, seen.Sub(at))
				break
			}
		}
	}
	out.mu.Unlock()
	ledger.mu.Unlock()
	slices.Sort(afterCreate)
	logs := ""
	for _, p := range started {
		logs += p.stderr.String() + p.stdout.String()
	}
	t.Logf("logrotate trial: %v, %d rotations every %v, %d applications at %d lines/s, %d kills, %d stops: %d lines written; "+
		"%d duplicates, %d alien lines, %d lost in copytruncate windows, %d lost elsewhere; log lines: %d WARN, %d INFO",
		tr.run, len(rotations), tr.every, len(tr.apps), tr.rate, killed, stopped, total, dups, alien, lostInWindow, len(lostOutside), strings.Count(logs, "level=WARN"), strings.Count(logs, "level=INFO"))
	t.Logf("write→published latency: p50 %v, p99 %v (%d lines); written within 2 s after a create rotation: p50 %v, p99 %v (%d lines)",
		quantile(all, 0.5).Round(time.Millisecond), quantile(all, 0.99).Round(time.Millisecond), len(all),
		quantile(afterCreate, 0.5).Round(time.Millisecond), quantile(afterCreate, 0.99).Round(time.Millisecond), len(afterCreate))
	warns := map[string]int{} // what was worth a WARN, by message
	for line := range strings.Lines(logs) {
		if strings.Contains(line, "level=WARN") {
			msg := strings.TrimSpace(line)
			if i := strings.Index(msg, "msg="); i >= 0 {
				msg = msg[i:] // the message and its attributes, without the time
			}
			warns[msg[:min(len(msg), 400)]]++
		}
	}
	for msg, n := range warns {
		t.Logf("WARN x%d: %s", n, msg)
	}
	slices.Sort(lostOutside)
	require.Contains(t, logs, "parked a followed file that was renamed away", "no renamed idle file was parked")
	require.NotContains(t, logs, "refused to follow", "a rotated archive was planned: the default excludes leave it out")
	require.Zero(t, dups, "duplicate lines")
	require.Zero(t, alien, "published lines that were never written (a compressed archive's bytes?)")
	require.Empty(t, lostOutside[:min(len(lostOutside), 20)], "lines lost outside logrotate's copy→truncate windows (%d)", len(lostOutside))
}
