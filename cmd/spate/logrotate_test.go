package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/internal/freeport"
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
	rate       int  // lines per second per application
	stop       bool // SIGSTOP a worker past its lease
	// full: the operator's form: the default store (an embedded etcd the
	// first worker starts), every timing at its default (the lease, the
	// commit interval, --discover), a 30 s SIGSTOP, and the workers
	// stopped by SIGTERM once the output holds what was written (no
	// --until-idle). The short form runs over an etcd server of the test
	// with a 2 s lease and ends by --until-idle.
	full bool
	// sample is how often the trial reads /metrics and spate inspect --json.
	sample time.Duration
}

type rotatedApp struct {
	name string
	conf string // its logrotate directives
	copy bool   // copytruncate: its lines in the copy→truncate window may be lost
}

func logrotateTrial() rotateTrial {
	if os.Getenv("SPATE_LOGROTATE_FULL") != "" {
		return rotateTrial{run: 3 * time.Minute, every: 15 * time.Second, rate: 200, stop: true, full: true, sample: 5 * time.Second, apps: []rotatedApp{
			{"app1", "copytruncate", true},
			{"app2", "copytruncate\n  compress\n  delaycompress", true},
			{"app3", "create", false},
			{"app4", "create", false},
			{"app5", "create\n  compress\n  delaycompress", false},
		}}
	}
	return rotateTrial{run: 24 * time.Second, every: 4 * time.Second, rate: 100, sample: 3 * time.Second, apps: []rotatedApp{
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
	var storeArgs, timing []string
	lease := followLease
	if tr.full {
		// The default store; only its port is chosen, so that the trial
		// cannot join another process's store on this machine.
		storeArgs = []string{"--embed-addr", "127.0.0.1:" + strconv.Itoa(freeport.WithOffset(t, 10))}
		lease = 15 * time.Second // --lease's default
	} else {
		storeArgs = storeCases("etcd")[0].args(t)
		timing = []string{"--until-idle", "5s", "--lease", followLease.String()}
	}
	var started []*proc
	worker := func(i int) *proc {
		args := []string{"backfill", "--follow", "--log-level", "info",
			"--src", src, "--dst", dst, "--job", "logrotate", "--instance", fmt.Sprintf("w%d", i)}
		if i == 0 {
			args = append(args, "--metrics-addr", "127.0.0.1:0") // w0 is neither killed nor stopped
		}
		p := start(t, dir, "", slices.Concat(args, timing, storeArgs)...)
		started = append(started, p)
		return p
	}
	ws := []*proc{worker(0)}
	ws[0].stdout.waitFor(t, ws[0], "metrics: http://", 2*time.Minute)
	metricsAddr := regexp.MustCompile(`metrics: http://(\S+)/metrics`).FindStringSubmatch(ws[0].stdout.String())[1]
	ws = append(ws, worker(1), worker(2))
	out := watchOutput(t, dst)
	smp := startRotSampler(dir, metricsAddr, slices.Concat([]string{"inspect", "--json", "--job", "logrotate"}, storeArgs), tr.sample)

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

	// The faults run beside the rotations, which go on every tr.every: a
	// kill halfway between the first two rotations, a stop halfway
	// between the third and the fourth (a worker killed right after a
	// copytruncate, before it committed what it read before the
	// truncation, leaves those lines to a copy that is not followed: see
	// the package documentation of filesource).
	var rotations, faults []window
	killed, stopped := 0, 0
	stopFor := lease + 1500*time.Millisecond
	if tr.full {
		stopFor = 30 * time.Second
	}
	// The rotations start once every application's first line is in the
	// output: lines a copytruncate moves into the copy before the fleet
	// first opened the file are not followed (the copy is excluded by
	// default, as in other log shippers), and a loaded machine can take
	// longer than tr.every to start three workers. What the trial judges is
	// rotation while following.
	firstLines(t, out, tr.apps, 2*time.Minute)
	begin := time.Now()
	faulting := make(chan struct{})
	go func() {
		defer close(faulting)
		time.Sleep(time.Until(begin.Add(tr.every + tr.every/2)))
		k := 2
		at := time.Now()
		if err := ws[k].cmd.Process.Kill(); err != nil {
			t.Errorf("kill w%d: %v", k, err)
			return
		}
		<-ws[k].done
		ws[k] = worker(k)
		killed++
		faults = append(faults, window{at, time.Now().Add(lease + 5*time.Second)})
		if !tr.stop {
			return
		}
		time.Sleep(time.Until(begin.Add(3*tr.every + tr.every/2)))
		k = 1
		at = time.Now()
		if err := ws[k].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Errorf("stop w%d: %v", k, err)
			return
		}
		time.Sleep(stopFor)
		if err := ws[k].cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Errorf("continue w%d: %v", k, err)
			return
		}
		stopped++
		faults = append(faults, window{at, time.Now().Add(5 * time.Second)})
	}()
	for i := 1; time.Since(begin) < tr.run; i++ {
		time.Sleep(time.Until(begin.Add(time.Duration(i) * tr.every)))
		from := time.Now()
		cmd := exec.Command(logrotateBin, "-f", "-s", statePath, confPath)
		b, err := cmd.CombinedOutput()
		require.NoError(t, err, "logrotate: %s", b)
		rotations = append(rotations, window{from, time.Now()})
	}
	<-faulting // ws, started, faults and the counts are the test's again
	close(stopWriting)
	<-writing
	if tr.full {
		// No --until-idle: once the output has not grown for 3 commit
		// intervals and two leases, the operator stops the workers.
		waitQuiet(out, 3*time.Second+2*lease, 5*time.Minute)
		for _, w := range ws {
			require.NoError(t, w.cmd.Process.Signal(syscall.SIGTERM))
		}
	}
	smp.close()
	// A followed job stopped by a signal exits 0 (its normal end), as one
	// ended by --until-idle does. The codes are checked once the lines
	// are counted, so that a failed run still reports its count.
	codes := make([]int, len(ws))
	for i, w := range ws {
		codes[i] = w.wait(t, 3*time.Minute)
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
	// A copytruncate that runs while the owner of its file is stopped or
	// dead leaves what the owner had not committed (from a commit
	// interval before the fault) in the copy, which is not followed: lost
	// to the fault, as the filesource documentation says.
	inFaultCopy := func(at time.Time) bool {
		for _, f := range faults {
			for _, r := range rotations {
				if !r.from.Before(f.from) && r.from.Before(f.to) && !at.Before(f.from.Add(-2*time.Second)) && !at.After(r.to) {
					return true
				}
			}
		}
		return false
	}
	var dups, alien, lostInWindow, lostToFault int
	var lostOutside []string
	ledger.mu.Lock()
	for line, at := range ledger.written {
		switch n := published[line]; {
		case n > 1:
			dups += n - 1
		case n == 0 && copying[ledger.app[line]] && inWindow(at):
			lostInWindow++
		case n == 0 && copying[ledger.app[line]] && inFaultCopy(at):
			lostToFault++
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
	var afterCreate, steady, afterCreateSteady []time.Duration
	ledger.mu.Lock()
	out.mu.Lock()
	for line, at := range ledger.written {
		seen, ok := out.seen[line]
		if !ok {
			continue
		}
		faulted := slices.ContainsFunc(faults, func(w window) bool { return !at.Before(w.from) && at.Before(w.to) })
		if !faulted {
			steady = append(steady, seen.Sub(at))
		}
		if copying[ledger.app[line]] {
			continue
		}
		for _, w := range rotations {
			if !at.Before(w.to) && at.Before(w.to.Add(2*time.Second)) {
				afterCreate = append(afterCreate, seen.Sub(at))
				if !faulted {
					afterCreateSteady = append(afterCreateSteady, seen.Sub(at))
				}
				break
			}
		}
	}
	out.mu.Unlock()
	ledger.mu.Unlock()
	slices.Sort(afterCreate)
	slices.Sort(steady)
	slices.Sort(afterCreateSteady)
	logs := ""
	for _, p := range started {
		logs += p.stderr.String() + p.stdout.String()
	}
	t.Logf("logrotate trial: %v, %d rotations every %v, %d applications at %d lines/s, %d kills, %d stops: %d lines written; "+
		"%d duplicates, %d alien lines, %d lost in copytruncate windows, %d lost to a copytruncate while their owner was stopped or dead, %d lost elsewhere; log lines: %d WARN, %d INFO",
		tr.run, len(rotations), tr.every, len(tr.apps), tr.rate, killed, stopped, total, dups, alien, lostInWindow, lostToFault, len(lostOutside), strings.Count(logs, "level=WARN"), strings.Count(logs, "level=INFO"))
	t.Logf("write→published latency: p50 %v, p99 %v (%d lines); written within 2 s after a create rotation: p50 %v, p99 %v (%d lines)",
		quantile(all, 0.5).Round(time.Millisecond), quantile(all, 0.99).Round(time.Millisecond), len(all),
		quantile(afterCreate, 0.5).Round(time.Millisecond), quantile(afterCreate, 0.99).Round(time.Millisecond), len(afterCreate))
	t.Logf("write→published latency outside the faults (a kill to a lease after its restart, a stop to 5 s after its SIGCONT): p50 %v, p99 %v (%d lines); of them written within 2 s after a create rotation: p50 %v, p99 %v (%d lines)",
		quantile(steady, 0.5).Round(time.Millisecond), quantile(steady, 0.99).Round(time.Millisecond), len(steady),
		quantile(afterCreateSteady, 0.5).Round(time.Millisecond), quantile(afterCreateSteady, 0.99).Round(time.Millisecond), len(afterCreateSteady))
	// Sample times count from the start of the first rotation period.
	smp.report(t, started[0], begin)
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
	for i, w := range ws {
		expectCode(t, "worker", codes[i], 0, w.stdout.String(), w.stderr.String())
	}
	require.Contains(t, logs, "parked a followed file that was renamed away", "no renamed idle file was parked")
	require.NotContains(t, logs, "refused to follow", "a rotated archive was planned: the default excludes leave it out")
	require.Zero(t, dups, "duplicate lines")
	require.Zero(t, alien, "published lines that were never written (a compressed archive's bytes?)")
	require.Empty(t, lostOutside[:min(len(lostOutside), 20)], "lines lost outside logrotate's copy→truncate windows (%d)", len(lostOutside))
	require.True(t, smp.sawLag(), "/metrics never carried spate_follow_lag_seconds for a followed file")
}

// waitQuiet waits until out has seen no new line for quiet (at most max).
func waitQuiet(out *outputWatch, quiet, max time.Duration) {
	deadline := time.Now().Add(max)
	n, since := -1, time.Now()
	for time.Now().Before(deadline) && time.Since(since) < quiet {
		out.mu.Lock()
		m := len(out.seen)
		out.mu.Unlock()
		if m != n {
			n, since = m, time.Now()
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// rotSample is what the trial saw of the job at one moment: the lag
// series /metrics carried, and spate inspect --json's summary.
type rotSample struct {
	at      time.Time
	metrics []string // the spate_follow_* lines
	maxAge  float64  // the largest spate_follow_lag_seconds
	bytes   float64  // the sum of spate_follow_lag_bytes
	// From spate inspect --json: splits in the store, completed, the
	// followed files waiting for a lane (their names), parked splits.
	splits, completed, waiting, parked int
	waitingFiles                       []string
	inspectErr                         string
}

// rotSampler reads w0's /metrics and spate inspect --json every period.
type rotSampler struct {
	mu      sync.Mutex
	samples []rotSample
	stop    chan struct{}
	done    chan struct{}
}

func startRotSampler(dir, metricsAddr string, inspect []string, period time.Duration) *rotSampler {
	s := &rotSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			select {
			case <-s.stop:
				return
			case <-time.After(period):
			}
			sm := rotSample{at: time.Now()}
			if resp, err := http.Get("http://" + metricsAddr + "/metrics"); err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				for line := range strings.Lines(string(b)) {
					if !strings.HasPrefix(line, "spate_follow_") {
						continue
					}
					line = strings.TrimSpace(line)
					sm.metrics = append(sm.metrics, line)
					i := strings.LastIndexByte(line, ' ')
					v, _ := strconv.ParseFloat(line[i+1:], 64)
					switch {
					case strings.HasPrefix(line, "spate_follow_lag_seconds{"):
						sm.maxAge = max(sm.maxAge, v)
					case strings.HasPrefix(line, "spate_follow_lag_bytes{"):
						sm.bytes += v
					}
				}
			}
			cmd := exec.Command(spateBin, inspect...)
			cmd.Dir = dir
			b, err := cmd.Output()
			var in inspection
			if err == nil {
				err = json.Unmarshal(b, &in)
			}
			if err != nil {
				sm.inspectErr = err.Error()
			} else {
				sm.splits, sm.completed, sm.waiting = in.Summary.Splits, in.Summary.Completed, in.Summary.Waiting
				for _, sp := range in.Splits {
					switch {
					case sp.State == "parked":
						sm.parked++
					case sp.State == "runnable" && sp.File != "":
						sm.waitingFiles = append(sm.waitingFiles, sp.File)
					}
				}
			}
			s.mu.Lock()
			s.samples = append(s.samples, sm)
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *rotSampler) close() {
	close(s.stop)
	<-s.done
}

// sawLag says whether /metrics ever carried a followed file's lag series.
func (s *rotSampler) sawLag() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sm := range s.samples {
		for _, l := range sm.metrics {
			if strings.HasPrefix(l, "spate_follow_lag_seconds{file=") {
				return true
			}
		}
	}
	return false
}

// report logs the samples: one line each, the /metrics lag lines of the
// sample furthest behind and of one mid-run, and w0's progress lines.
func (s *rotSampler) report(t *testing.T, w0 *proc, from time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	worst, maxWait, liveWaits := 0, 0, 0
	for i, sm := range s.samples {
		live := 0
		for _, f := range sm.waitingFiles {
			if strings.HasSuffix(f, ".log") {
				live++
			}
		}
		liveWaits += live
		maxWait = max(maxWait, sm.waiting)
		if sm.maxAge > s.samples[worst].maxAge {
			worst = i
		}
		t.Logf("sample +%3.0fs: /metrics lag max %.1fs, %.0f bytes; store: %d splits (%d completed, %d parked); %d files waiting for a lane %v %s",
			sm.at.Sub(from).Seconds(), sm.maxAge, sm.bytes, sm.splits, sm.completed, sm.parked, sm.waiting, sm.waitingFiles, sm.inspectErr)
	}
	t.Logf("samples: %d; the most files waiting for a lane at once: %d; live files (*.log) seen waiting: %d times", len(s.samples), maxWait, liveWaits)
	if len(s.samples) > 0 {
		t.Logf("/metrics lag lines mid-run (+%.0fs):\n%s", s.samples[len(s.samples)/2].at.Sub(from).Seconds(), strings.Join(s.samples[len(s.samples)/2].metrics, "\n"))
		t.Logf("/metrics lag lines furthest behind (+%.0fs):\n%s", s.samples[worst].at.Sub(from).Seconds(), strings.Join(s.samples[worst].metrics, "\n"))
	}
	var progress []string
	for line := range strings.Lines(w0.stdout.String() + w0.stderr.String()) {
		if strings.Contains(line, "following ") && strings.Contains(line, " behind") {
			progress = append(progress, strings.TrimSpace(line))
		}
	}
	for i := 0; i < len(progress); i += max(1, len(progress)/12) {
		t.Logf("progress: %s", progress[i])
	}
}

// firstLines waits until the output holds a line of each application.
func firstLines(t *testing.T, out *outputWatch, apps []rotatedApp, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool {
		out.mu.Lock()
		defer out.mu.Unlock()
		for _, a := range apps {
			found := false
			for line := range out.seen {
				if strings.HasPrefix(line, a.name+"-") {
					found = true
					break
				}
			}
			if !found {
				return false
			}
		}
		return true
	}, within, 100*time.Millisecond, "every application's first line in the output")
}
