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

func (f *demoFlags) run() (code int) {
	start := time.Now()
	say := func(who, format string, args ...any) {
		fmt.Printf("%6.1fs  %-9s %s\n", time.Since(start).Seconds(), who, fmt.Sprintf(format, args...))
	}
	if _, err := f.log.logger(os.Stderr); err != nil {
		return fail(exitUsage, "%v", err)
	}
	exe, err := os.Executable()
	if err != nil {
		return fail(exitFailed, "demo: find this binary: %v", err)
	}
	tmp, err := os.MkdirTemp("", "spate-demo-")
	if err != nil {
		return fail(exitFailed, "demo: %v", err)
	}
	defer func() {
		if f.keep || code != exitOK {
			fmt.Printf("\nthe demo's files (corpus, output, worker logs and histories) are in %s\n", tmp)
			return
		}
		_ = os.RemoveAll(tmp)
	}()
	src, dst := filepath.Join(tmp, "src"), filepath.Join(tmp, "dst")

	fmt.Println("spate demo: one backfill job, shared by worker processes over a coordination store")
	fmt.Println()

	// The store.
	var ready atomic.Bool
	reg := newRegistry()
	ms, err := serveMetrics(f.metrics, healthHandler(reg, ready.Load))
	if err != nil {
		return fail(exitFailed, "--metrics-addr: %v", err)
	}
	defer ms.stop()
	ports, err := freeLoopbackPorts(2)
	if err != nil {
		return fail(exitFailed, "demo: %v", err)
	}
	clientAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	srv, err := embedetcd.Start(embedetcd.Member{
		Dir:       filepath.Join(tmp, "etcd"),
		ClientURL: url.URL{Scheme: "http", Host: clientAddr},
		PeerURL:   url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(ports[1])},
	})
	if err != nil {
		return fail(exitFailed, "demo: start the embedded etcd: %v", err)
	}
	defer srv.Close()
	storeURL := "etcd://" + clientAddr
	say("demo", "store: embedded etcd at %s (production raft timing, data in %s)", clientAddr, filepath.Join(tmp, "etcd"))

	// The corpus.
	lines, size, err := generateCorpus(src, f.files)
	if err != nil {
		return fail(exitFailed, "demo: corpus: %v", err)
	}
	say("demo", "corpus: %d files, %s lines, %s in %s", f.files, count(lines), bytesStr(size), src)

	// The observer's store client.
	log, _ := f.log.logger(os.Stderr)
	conn, err := (&storeFlags{url: storeURL}).connect(context.Background(), log, connectStart)
	if err != nil {
		return fail(exitFailed, "demo: %v", err)
	}
	defer conn.close()
	const job = "demo"
	st, err := conn.open(context.Background(), job, f.lease, 10*time.Second)
	if err != nil {
		return fail(exitFailed, "demo: open the store: %v", err)
	}
	defer st.Close()
	ready.Store(true)

	// The workers.
	workerArgs := func(name string) []string {
		return []string{"backfill", "--src", src, "--dst", dst, "--store", storeURL, "--job", job,
			"--instance", name, "--lease", f.lease.String(), "--lanes", "3", "--rate", strconv.FormatFloat(f.rate, 'f', -1, 64),
			"--split-bytes", strconv.Itoa(256 << 10), "--split-files", "4", "--commit-interval", "500ms",
			"--verify=false", "--history", filepath.Join(tmp, name+".history.jsonl"),
			"--log-format", f.log.format, "--log-level", f.log.level}
	}
	say("demo", "each worker runs: spate %s", strings.Join(workerArgs("worker-N"), " "))
	say("demo", "lease %v: a dead worker's splits are taken over within a lease (plus etcd's expiry scan, <= 0.5s)", f.lease)
	fmt.Println()

	type line struct {
		who, text string
	}
	lineCh := make(chan line, 256)
	var readers sync.WaitGroup
	workers := make([]*demoWorker, f.workers)
	for i := range workers {
		name := fmt.Sprintf("worker-%d", i+1)
		w, err := startDemoWorker(exe, name, workerArgs(name), filepath.Join(tmp, name+".log"))
		if err != nil {
			for _, o := range workers[:i] {
				o.kill()
			}
			return fail(exitFailed, "demo: start %s: %v", name, err)
		}
		workers[i] = w.demoWorker
		stdout := w.stdout
		readers.Go(func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lineCh <- line{who: name, text: sc.Text()}
			}
		})
		say(name, "started (pid %d)", w.cmd.Process.Pid)
	}
	defer func() {
		for _, w := range workers {
			w.kill()
		}
	}()
	go func() {
		readers.Wait()
		close(lineCh)
	}()
	sigs := watchSignals(func(os.Signal) {
		for _, w := range workers {
			w.kill()
		}
	}, nil)
	defer sigs.stop()

	victim := workers[1]
	var victimHeld map[string]int64 // split -> committed watermark at the kill
	killedAt := time.Time{}
	takenOver := map[string]string{} // split -> survivor
	var takeoverDone time.Time
	deadline := time.NewTimer(55 * time.Second)
	defer deadline.Stop()
	poll := time.NewTicker(250 * time.Millisecond)
	defer poll.Stop()
	lastProgress := time.Time{}
	eventLine := regexp.MustCompile(`^\s*[0-9.]+s  (.*)$`)
	gainedLine := regexp.MustCompile(`^gained (\S+) \(epoch (\d+)\)`)
	shown := []string{"gained ", "completed ", "lost ", "handed ", "the job ", "QUARANTINED", "rebalance", "commit of ", "failed ", "received "}
	failure := ""
	linesOpen := true

	for linesOpen {
		select {
		case l, ok := <-lineCh:
			if !ok {
				linesOpen = false
				break
			}
			m := eventLine.FindStringSubmatch(l.text)
			if m == nil {
				if strings.HasPrefix(l.text, "summary: ") {
					say(l.who, "%s", l.text)
				}
				continue
			}
			text := m[1]
			if !slices.ContainsFunc(shown, func(p string) bool { return strings.HasPrefix(text, p) }) {
				continue
			}
			say(l.who, "%s", text)
			if g := gainedLine.FindStringSubmatch(text); g != nil && victimHeld != nil && l.who != victim.name {
				if wm, held := victimHeld[g[1]]; held && takenOver[g[1]] == "" {
					takenOver[g[1]] = l.who
					from := "from the start (it had committed nothing)"
					if wm > 0 {
						from = fmt.Sprintf("from byte %s, the last position %s committed", count(wm), victim.name)
					}
					say("demo", "^ TAKEOVER %.1fs after the kill: %s resumes %s %s", time.Since(killedAt).Seconds(), l.who, g[1], from)
					if len(takenOver) == len(victimHeld) {
						takeoverDone = time.Now()
					}
				}
			}
		case <-poll.C:
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			s, js, err := readJob(ctx, st)
			cancel()
			if err != nil || !s.exists || s.total == 0 {
				continue
			}
			frac := float64(s.done) / float64(s.total)
			if time.Since(lastProgress) >= 2*time.Second {
				lastProgress = time.Now()
				say("demo", "progress %3.0f%%: %d/%d splits completed, %s of %s committed, %d workers present", 100*frac,
					s.completed, s.splits, bytesStr(s.done), bytesStr(s.total), len(js.Members))
			}
			if victimHeld == nil && frac >= 0.3 {
				held := map[string]int64{}
				midway := false
				for _, sp := range js.Splits {
					if sp.Status != spate.StatusRunnable || sp.LeaseOwner != victim.name {
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
					failure = "the job finished before the kill: the demo could not show a takeover (try a lower --rate)"
					continue
				}
				if len(held) == 0 || (!midway && frac < 0.6) {
					continue // wait until the victim holds a split it has partly committed
				}
				victim.kill()
				killedAt = time.Now()
				victimHeld = held
				var parts []string
				for _, id := range slices.Sorted(maps.Keys(held)) {
					parts = append(parts, fmt.Sprintf("%s (committed to byte %s)", id, count(held[id])))
				}
				say("demo", "SIGKILL %s (pid %d) at %.0f%%: it dies holding %d split(s): %s", victim.name, victim.cmd.Process.Pid,
					100*frac, len(held), strings.Join(parts, ", "))
				say("demo", "nothing hands them back: the survivors wait out the lease, then take them over")
			}
		case <-deadline.C:
			failure = "the demo did not finish within 55s"
			for _, w := range workers {
				w.kill()
			}
		}
	}
	for _, w := range workers {
		<-w.exited
	}
	elapsed := time.Since(start)
	fmt.Println()

	// The verdict.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	final, _, err := readJob(ctx, st)
	if err != nil {
		failure = fmt.Sprintf("read the job's final state: %v", err)
	}
	for _, w := range workers {
		if w == victim {
			continue
		}
		if w.err != nil && failure == "" {
			failure = fmt.Sprintf("%s failed: %v (see %s)", w.name, w.err, w.logf.Name())
		}
	}
	if sigs.signal() != nil {
		failure = "interrupted"
	}
	if victimHeld == nil && failure == "" {
		failure = "no worker was killed: the demo could not show a takeover"
	}
	fmt.Println("result")
	fmt.Printf("  job           %s: %d/%d splits completed, %d quarantined\n", job, final.completed, final.splits, final.quarantined)
	if victimHeld != nil {
		after := "not all of them"
		if !takeoverDone.IsZero() {
			after = fmt.Sprintf("all of them within %.1fs of the kill", takeoverDone.Sub(killedAt).Seconds())
		}
		fmt.Printf("  takeover      the survivors took over the %d split(s) %s died holding: %s\n", len(victimHeld), victim.name, after)
	}
	if final.exists && !final.completedAll && failure == "" {
		failure = "the job did not complete"
	}
	r, verr := verifyOutput(context.Background(), filesource.Dir(src), &destination{location: dst, dir: dst})
	if verr != nil {
		failure = fmt.Sprintf("verification could not run: %v", verr)
	} else {
		fmt.Printf("  verification  %s\n", r.report())
		if !r.OK() && failure == "" {
			failure = "verification failed: the output is not every input line exactly once"
		}
		if r.InputLines != lines && failure == "" {
			failure = fmt.Sprintf("the verification counted %d input lines, the corpus has %d", r.InputLines, lines)
		}
	}
	fmt.Printf("  elapsed       %.1fs\n", elapsed.Seconds())
	if failure != "" {
		fmt.Printf("FAIL: %s\n", failure)
		for _, w := range workers {
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
