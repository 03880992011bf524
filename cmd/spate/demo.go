package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/embedetcd"
	"github.com/spate-go/spate/pipeline/filesource"
)

const demoAbout = `A self-contained proof of spate on this machine, in under a minute:

  1. starts an embedded etcd (temporary directory, free port) as the coordination store;
  2. generates a corpus of log files;
  3. runs several worker processes of this binary (spate backfill) over it as one job;
  4. kills one worker with SIGKILL in the middle of the job;
  5. shows the survivors take its splits over and resume them from their last commit;
  6. verifies that every input line reached the output exactly once: the dead
     worker's staged but uncommitted lines never became visible, and the
     survivors resumed its splits from the last commit into the same files.

Exits 0 only if the job completed and the verification passed.`

type demoFlags struct {
	workers int
	files   int
	lease   time.Duration
	rate    float64
	keep    bool
	metrics string
	log     logFlags
}

func runDemo(args []string) int {
	var f demoFlags
	fs := newFlagSet("demo", "[flags]", demoAbout)
	fs.IntVar(&f.workers, "workers", 3, "worker processes (at least 2)")
	fs.IntVar(&f.files, "files", 48, "files in the generated corpus (about 1,000 lines each)")
	fs.DurationVar(&f.lease, "lease", 3*time.Second, "split lease: how long the dead worker's splits wait before the takeover (whole seconds)")
	fs.Float64Var(&f.rate, "rate", 2500, "lines per second per worker (keeps the job long enough to kill a worker mid-run)")
	fs.BoolVar(&f.keep, "keep", false, "keep the temporary directory (corpus, output, worker logs and histories)")
	fs.StringVar(&f.metrics, "metrics-addr", "", "serve Prometheus /metrics, /healthz and /readyz on this address")
	f.log.register(fs, "warn")
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if err := checkFlags(
		func() error { return noPositional(pos) },
		func() error { return atLeast("workers", int64(f.workers), 2) },
		func() error { return atLeast("files", int64(f.files), 1) },
		func() error {
			if f.lease < 2*time.Second || f.lease%time.Second != 0 {
				return flagErrorf("--lease %v: whole seconds, at least 2s (the embedded etcd's lease floor)", f.lease)
			}
			return nil
		},
		func() error {
			if !(f.rate > 0) || math.IsInf(f.rate, 0) {
				return flagErrorf("--rate %v: must be a positive number of lines per second", f.rate)
			}
			return nil
		},
		func() error { return checkAddr("metrics-addr", f.metrics) },
		f.log.validate,
	); err != nil {
		return usageError(fs, "%v", err)
	}
	return f.run()
}

// demoWorker is one spate backfill process of the demo.
type demoWorker struct {
	name   string
	cmd    *exec.Cmd
	logf   *os.File
	exited chan struct{}
	err    error
	killed atomic.Bool
}

// demoRun is one run of the demo: what its phases share.
type demoRun struct {
	f        *demoFlags
	start    time.Time
	tmp      string
	src, dst string
	storeURL string
	lines    int64 // the corpus's lines
	st       spate.Store
	closers  []func() // undone in reverse when the run ends
	workers  []*demoWorker
	victim   *demoWorker
	lineCh   chan demoLine
	sigs     *interrupts

	// What the follow phase saw.
	victimHeld   map[string]int64 // split -> committed watermark at the kill
	killedAt     time.Time
	takenOver    map[string]string // split -> survivor
	takeoverDone time.Time
	lastProgress time.Time
	failure      string
}

// demoLine is one line of a worker's output.
type demoLine struct {
	who, text string
}

const demoJob = "demo"

// run is the demo, in phases: set up the store, the corpus and the
// observer (setUp), start the workers (startWorkers), follow the job and
// kill one worker mid-run (follow), then judge it (verdict).
func (f *demoFlags) run() (code int) {
	d := &demoRun{f: f, start: time.Now(), takenOver: map[string]string{}}
	if _, err := f.log.logger(os.Stderr); err != nil {
		return fail(exitUsage, "%v", err)
	}
	exe, err := os.Executable()
	if err != nil {
		return fail(exitFailed, "demo: find this binary: %v", err)
	}
	if d.tmp, err = os.MkdirTemp("", "spate-demo-"); err != nil {
		return fail(exitFailed, "demo: %v", err)
	}
	defer func() {
		if f.keep || code != exitOK {
			fmt.Printf("\nthe demo's files (corpus, output, worker logs and histories) are in %s\n", d.tmp)
			return
		}
		_ = os.RemoveAll(d.tmp)
	}()
	defer func() {
		for i := len(d.closers) - 1; i >= 0; i-- {
			d.closers[i]()
		}
	}()
	d.src, d.dst = filepath.Join(d.tmp, "src"), filepath.Join(d.tmp, "dst")

	fmt.Println("spate demo: one backfill job, shared by worker processes over a coordination store")
	fmt.Println()
	if code, ok := d.setUp(); !ok {
		return code
	}
	if code, ok := d.startWorkers(exe); !ok {
		return code
	}
	d.follow()
	for _, w := range d.workers {
		<-w.exited
	}
	return d.verdict(time.Since(d.start))
}

// say prints one line of the demo's narrative.
func (d *demoRun) say(who, format string, args ...any) {
	fmt.Printf("%6.1fs  %-9s %s\n", time.Since(d.start).Seconds(), who, fmt.Sprintf(format, args...))
}

// setUp starts the embedded etcd and the metrics server, generates the
// corpus and opens the observer's store client.
func (d *demoRun) setUp() (code int, ok bool) {
	f := d.f
	var ready atomic.Bool
	reg := newRegistry()
	ms, err := serveMetrics(f.metrics, healthHandler(reg, ready.Load))
	if err != nil {
		return fail(exitFailed, "--metrics-addr: %v", err), false
	}
	d.closers = append(d.closers, ms.stop)
	ports, err := freeLoopbackPorts(2)
	if err != nil {
		return fail(exitFailed, "demo: %v", err), false
	}
	clientAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	srv, err := embedetcd.Start(embedetcd.Member{
		Dir:       filepath.Join(d.tmp, "etcd"),
		ClientURL: url.URL{Scheme: "http", Host: clientAddr},
		PeerURL:   url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(ports[1])},
	})
	if err != nil {
		return fail(exitFailed, "demo: start the embedded etcd: %v", err), false
	}
	d.closers = append(d.closers, func() { srv.Close() })
	d.storeURL = "etcd://" + clientAddr
	d.say("demo", "store: embedded etcd at %s (production raft timing, data in %s)", clientAddr, filepath.Join(d.tmp, "etcd"))

	lines, size, err := generateCorpus(d.src, f.files)
	if err != nil {
		return fail(exitFailed, "demo: corpus: %v", err), false
	}
	d.lines = lines
	d.say("demo", "corpus: %d files, %s lines, %s in %s", f.files, count(lines), bytesStr(size), d.src)

	// The observer's store client.
	log, _ := f.log.logger(os.Stderr)
	conn, err := (&storeFlags{url: d.storeURL}).connect(context.Background(), log, connectStart)
	if err != nil {
		return fail(exitFailed, "demo: %v", err), false
	}
	d.closers = append(d.closers, conn.close)
	st, err := conn.open(context.Background(), demoJob, f.lease, 10*time.Second)
	if err != nil {
		return fail(exitFailed, "demo: open the store: %v", err), false
	}
	d.closers = append(d.closers, func() { _ = st.Close() })
	d.st = st
	ready.Store(true)
	return 0, true
}

// workerArgs is the command line of one worker.
func (d *demoRun) workerArgs(name string) []string {
	f := d.f
	return []string{"backfill", "--src", d.src, "--dst", d.dst, "--store", d.storeURL, "--job", demoJob,
		"--instance", name, "--lease", f.lease.String(), "--lanes", "3", "--rate", strconv.FormatFloat(f.rate, 'f', -1, 64),
		"--split-bytes", strconv.Itoa(256 << 10), "--split-files", "4", "--commit-interval", "500ms",
		"--verify=false", "--history", filepath.Join(d.tmp, name+".history.jsonl"),
		"--log-format", f.log.format, "--log-level", f.log.level}
}

// startWorkers starts the worker processes and gathers their output
// lines on d.lineCh; a signal to the demo kills them.
func (d *demoRun) startWorkers(exe string) (code int, ok bool) {
	f := d.f
	d.say("demo", "each worker runs: spate %s", strings.Join(d.workerArgs("worker-N"), " "))
	d.say("demo", "lease %v: a dead worker's splits are taken over within a lease (plus etcd's expiry scan, <= 0.5s)", f.lease)
	fmt.Println()

	d.lineCh = make(chan demoLine, 256)
	var readers sync.WaitGroup
	d.workers = make([]*demoWorker, f.workers)
	for i := range d.workers {
		name := fmt.Sprintf("worker-%d", i+1)
		w, err := startDemoWorker(exe, name, d.workerArgs(name), filepath.Join(d.tmp, name+".log"))
		if err != nil {
			for _, o := range d.workers[:i] {
				o.kill()
			}
			return fail(exitFailed, "demo: start %s: %v", name, err), false
		}
		d.workers[i] = w.demoWorker
		stdout := w.stdout
		readers.Go(func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				d.lineCh <- demoLine{who: name, text: sc.Text()}
			}
		})
		d.say(name, "started (pid %d)", w.cmd.Process.Pid)
	}
	d.closers = append(d.closers, d.killAll)
	go func() {
		readers.Wait()
		close(d.lineCh)
	}()
	d.sigs = watchSignals(func(os.Signal) { d.killAll() }, nil)
	d.closers = append(d.closers, d.sigs.stop)
	d.victim = d.workers[1]
	return 0, true
}

// killAll kills every worker.
func (d *demoRun) killAll() {
	for _, w := range d.workers {
		w.kill()
	}
}

var (
	demoEventLine  = regexp.MustCompile(`^\s*[0-9.]+s  (.*)$`)
	demoGainedLine = regexp.MustCompile(`^gained (\S+) \(epoch (\d+)\)`)
	// demoShown are the worker event lines the demo repeats.
	demoShown = []string{"gained ", "completed ", "lost ", "handed ", "the job ", "QUARANTINED", "rebalance", "commit of ", "failed ", "received "}
)

// follow repeats the workers' event lines, reports progress, kills the
// victim once the job is 30% committed and it holds a split it has
// partly committed, and notes the takeovers, until every worker's output
// ends (or 55 s pass).
func (d *demoRun) follow() {
	deadline := time.NewTimer(55 * time.Second)
	defer deadline.Stop()
	poll := time.NewTicker(250 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case l, ok := <-d.lineCh:
			if !ok {
				return
			}
			d.onLine(l)
		case <-poll.C:
			d.onPoll()
		case <-deadline.C:
			d.failure = "the demo did not finish within 55s"
			d.killAll()
		}
	}
}

// onLine repeats a worker's event line and notes a takeover of a split
// the victim died holding.
func (d *demoRun) onLine(l demoLine) {
	m := demoEventLine.FindStringSubmatch(l.text)
	if m == nil {
		if strings.HasPrefix(l.text, "summary: ") {
			d.say(l.who, "%s", l.text)
		}
		return
	}
	text := m[1]
	if !slices.ContainsFunc(demoShown, func(p string) bool { return strings.HasPrefix(text, p) }) {
		return
	}
	d.say(l.who, "%s", text)
	g := demoGainedLine.FindStringSubmatch(text)
	if g == nil || d.victimHeld == nil || l.who == d.victim.name {
		return
	}
	if wm, held := d.victimHeld[g[1]]; held && d.takenOver[g[1]] == "" {
		d.takenOver[g[1]] = l.who
		from := "from the start (it had committed nothing)"
		if wm > 0 {
			from = fmt.Sprintf("from byte %s, the last position %s committed", count(wm), d.victim.name)
		}
		d.say("demo", "^ TAKEOVER %.1fs after the kill: %s resumes %s %s", time.Since(d.killedAt).Seconds(), l.who, g[1], from)
		if len(d.takenOver) == len(d.victimHeld) {
			d.takeoverDone = time.Now()
		}
	}
}

// onPoll reads the job: progress every 2 s, and the kill once due.
func (d *demoRun) onPoll() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	s, js, err := readJob(ctx, d.st)
	cancel()
	if err != nil || !s.exists || s.total == 0 {
		return
	}
	frac := float64(s.done) / float64(s.total)
	if time.Since(d.lastProgress) >= 2*time.Second {
		d.lastProgress = time.Now()
		d.say("demo", "progress %3.0f%%: %d/%d splits completed, %s of %s committed, %d workers present", 100*frac,
			s.completed, s.splits, bytesStr(s.done), bytesStr(s.total), len(js.Members))
	}
	if d.victimHeld != nil || frac < 0.3 {
		return
	}
	held := map[string]int64{}
	midway := false
	for _, sp := range js.Splits {
		if sp.Status != spate.StatusRunnable || sp.LeaseOwner != d.victim.name {
			continue
		}
		wm := int64(0)
		if sp.Progress != nil {
			wm = sp.Progress.Watermark
		}
		held[sp.ID.String()] = wm
		midway = midway || wm > 0
	}
	if s.completedAll {
		d.failure = "the job finished before the kill: the demo could not show a takeover (try a lower --rate)"
		return
	}
	if len(held) == 0 || (!midway && frac < 0.6) {
		return // wait until the victim holds a split it has partly committed
	}
	d.victim.kill()
	d.killedAt = time.Now()
	d.victimHeld = held
	var parts []string
	for _, id := range slices.Sorted(maps.Keys(held)) {
		parts = append(parts, fmt.Sprintf("%s (committed to byte %s)", id, count(held[id])))
	}
	d.say("demo", "SIGKILL %s (pid %d) at %.0f%%: it dies holding %d split(s): %s", d.victim.name, d.victim.cmd.Process.Pid,
		100*frac, len(held), strings.Join(parts, ", "))
	d.say("demo", "nothing hands them back: the survivors wait out the lease, then take them over")
}

// verdict prints the result and verifies the output: exitOK only if the
// job completed, a worker was killed and taken over, and every input line
// is in the output exactly once.
func (d *demoRun) verdict(elapsed time.Duration) int {
	fmt.Println()
	failure := d.failure
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	final, _, err := readJob(ctx, d.st)
	if err != nil {
		failure = fmt.Sprintf("read the job's final state: %v", err)
	}
	for _, w := range d.workers {
		if w == d.victim {
			continue
		}
		if w.err != nil && failure == "" {
			failure = fmt.Sprintf("%s failed: %v (see %s)", w.name, w.err, w.logf.Name())
		}
	}
	if d.sigs.signal() != nil {
		failure = "interrupted"
	}
	if d.victimHeld == nil && failure == "" {
		failure = "no worker was killed: the demo could not show a takeover"
	}
	fmt.Println("result")
	fmt.Printf("  job           %s: %d/%d splits completed, %d quarantined\n", demoJob, final.completed, final.splits, final.quarantined)
	if d.victimHeld != nil {
		after := "not all of them"
		if !d.takeoverDone.IsZero() {
			after = fmt.Sprintf("all of them within %.1fs of the kill", d.takeoverDone.Sub(d.killedAt).Seconds())
		}
		fmt.Printf("  takeover      the survivors took over the %d split(s) %s died holding: %s\n", len(d.victimHeld), d.victim.name, after)
	}
	if final.exists && !final.completedAll && failure == "" {
		failure = "the job did not complete"
	}
	r, verr := verifyOutput(context.Background(), filesource.Dir(d.src), &destination{location: d.dst, dir: d.dst})
	if verr != nil {
		failure = fmt.Sprintf("verification could not run: %v", verr)
	} else {
		fmt.Printf("  verification  %s\n", r.report())
		if !r.OK() && failure == "" {
			failure = "verification failed: the output is not every input line exactly once"
		}
		if r.InputLines != d.lines && failure == "" {
			failure = fmt.Sprintf("the verification counted %d input lines, the corpus has %d", r.InputLines, d.lines)
		}
	}
	fmt.Printf("  elapsed       %.1fs\n", elapsed.Seconds())
	if failure != "" {
		fmt.Printf("FAIL: %s\n", failure)
		for _, w := range d.workers {
			if tail := fileTail(w.logf.Name(), 15); tail != "" {
				fmt.Printf("\n--- %s stderr (last lines) ---\n%s\n", w.name, tail)
			}
		}
		return exitFailed
	}
	fmt.Println("PASS: every input line reached the output exactly once despite the killed worker")
	return exitOK
}

type demoWorkerIO struct {
	*demoWorker
	stdout io.ReadCloser
}

func startDemoWorker(exe, name string, args []string, logPath string) (*demoWorkerIO, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, args...)
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	setDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	w := &demoWorker{name: name, cmd: cmd, logf: logf, exited: make(chan struct{})}
	go func() {
		w.err = cmd.Wait()
		logf.Close()
		close(w.exited)
	}()
	return &demoWorkerIO{demoWorker: w, stdout: stdout}, nil
}

// kill sends SIGKILL once (a no-op after the process exited).
func (w *demoWorker) kill() {
	if w == nil || w.killed.Swap(true) {
		return
	}
	select {
	case <-w.exited:
	default:
		_ = w.cmd.Process.Signal(syscall.SIGKILL)
	}
}

func freeLoopbackPorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// generateCorpus writes files of web-server-like log lines under dir and
// returns the line and byte counts. The content is fixed by a seed.
func generateCorpus(dir string, files int) (lines, size int64, err error) {
	r := rand.New(rand.NewPCG(1, 2))
	methods := []string{"GET", "GET", "GET", "POST", "PUT", "DELETE"}
	paths := []string{"/api/items", "/api/users", "/api/orders", "/static/app.js", "/healthz", "/api/search"}
	codes := []int{200, 200, 200, 200, 201, 204, 304, 404, 500}
	base := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	for i := range files {
		p := filepath.Join(dir, fmt.Sprintf("host-%02d", i%6), fmt.Sprintf("access-%03d.log", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return 0, 0, err
		}
		var b strings.Builder
		n := 600 + r.IntN(800)
		t := base.Add(time.Duration(i) * time.Hour)
		for j := range n {
			t = t.Add(time.Duration(r.IntN(3000)) * time.Millisecond)
			fmt.Fprintf(&b, "%s host-%02d %s %s/%d %d %dms req=%d-%d\n", t.Format(time.RFC3339Nano), i%6,
				methods[r.IntN(len(methods))], paths[r.IntN(len(paths))], r.IntN(100000), codes[r.IntN(len(codes))],
				1+r.IntN(900), i, j)
		}
		if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
			return 0, 0, err
		}
		lines += int64(n)
		size += int64(b.Len())
	}
	return lines, size, nil
}

// fileTail returns the last n lines of a file.
func fileTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, "\n")
}
