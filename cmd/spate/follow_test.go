package main

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gocloud.dev/blob"

	"github.com/spate-go/spate/internal/etcdservers"
	"github.com/spate-go/spate/internal/s3test"
)

// followChaosFor is how long the chaos phase of the --follow test runs:
// SPATE_FOLLOW_CHAOS (a duration) or 20s. scripts/follow-chaos.sh runs it
// for a minute.
func followChaosFor(t *testing.T) time.Duration {
	if v := os.Getenv("SPATE_FOLLOW_CHAOS"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "SPATE_FOLLOW_CHAOS")
		return d
	}
	return 20 * time.Second
}

// followInput writes a followed input: files appear and grow, one is
// renamed away (its writer writing on to it a moment, then to a new file
// at its path), one is truncated once its lines are published, and every
// line ever written is in the ledger with its write time.
type followInput struct {
	t       *testing.T
	dir     string
	mu      sync.Mutex
	files   map[string]*os.File // open for append, by name
	n       map[string]int      // lines written, by stream
	written map[string]time.Time
	stream  map[string]string // the stream a file's lines belong to
}

func newFollowInput(t *testing.T, dir string) *followInput {
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return &followInput{t: t, dir: dir, files: map[string]*os.File{}, n: map[string]int{},
		written: map[string]time.Time{}, stream: map[string]string{}}
}

// add appends k lines of stream to the file name (created if need be).
func (in *followInput) add(name, stream string, k int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	f := in.files[name]
	if f == nil {
		var err error
		f, err = os.OpenFile(filepath.Join(in.dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		require.NoError(in.t, err)
		in.files[name] = f
		in.stream[name] = stream
	}
	var b strings.Builder
	now := time.Now()
	for range k {
		in.n[stream]++
		line := fmt.Sprintf("%s-%07d %s", stream, in.n[stream], strings.Repeat("y", in.n[stream]%50))
		in.written[line] = now
		b.WriteString(line + "\n")
	}
	_, err := f.WriteString(b.String())
	require.NoError(in.t, err)
}

// reopen closes name's descriptor: the next add creates the file anew.
func (in *followInput) reopen(name string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if f := in.files[name]; f != nil {
		f.Close()
		delete(in.files, name)
	}
}

func (in *followInput) closeAll() {
	in.mu.Lock()
	defer in.mu.Unlock()
	for name, f := range in.files {
		f.Close()
		delete(in.files, name)
	}
}

// ledger writes every line written to path, and returns their count.
func (in *followInput) ledger(path string) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	lines := make([]string, 0, len(in.written))
	for l := range in.written {
		lines = append(lines, l)
	}
	slices.Sort(lines)
	require.NoError(in.t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	return len(lines)
}

// outputWatch reads the published output as it grows (the staged file
// sink only appends to DST/<split>.out; the bucket sink only adds
// immutable parts) and records when each line was first seen.
type outputWatch struct {
	dst    string
	bucket *blob.Bucket // a bucket destination; nil: a directory
	mu     sync.Mutex
	seen   map[string]time.Time
	offs   map[string]int64 // per file, the bytes read; per part, its length once read
	stop   chan struct{}
	done   chan struct{}
}

func watchOutput(t *testing.T, dst string) *outputWatch {
	w := &outputWatch{dst: dst, seen: map[string]time.Time{}, offs: map[string]int64{}, stop: make(chan struct{}), done: make(chan struct{})}
	if strings.HasPrefix(dst, "s3://") {
		w.bucket = s3test.Open(t, dst)
	}
	go func() {
		defer close(w.done)
		for {
			w.scan()
			select {
			case <-w.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return w
}

// record notes a published line's value as seen now, if it is new.
func (w *outputWatch) record(line string, now time.Time) {
	_, v, _ := strings.Cut(strings.TrimSuffix(line, "\n"), "\t")
	w.mu.Lock()
	if _, ok := w.seen[v]; !ok {
		w.seen[v] = now
	}
	w.mu.Unlock()
}

// scanBucket reads each published part once: parts never change.
func (w *outputWatch) scanBucket() {
	ctx := context.Background()
	it := w.bucket.List(nil)
	now := time.Now()
	for {
		obj, err := it.Next(ctx)
		if err != nil {
			return // io.EOF, or a listing error: the next scan lists again
		}
		if strings.HasPrefix(obj.Key, ".spate/") || !strings.HasSuffix(obj.Key, ".out") {
			continue
		}
		w.mu.Lock()
		_, read := w.offs[obj.Key]
		w.mu.Unlock()
		if read {
			continue
		}
		data, err := w.bucket.ReadAll(ctx, obj.Key)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(data)) {
			w.record(line, now)
		}
		w.mu.Lock()
		w.offs[obj.Key] = int64(len(data))
		w.mu.Unlock()
	}
}

func (w *outputWatch) scan() {
	if w.bucket != nil {
		w.scanBucket()
		return
	}
	outs, _ := filepath.Glob(filepath.Join(w.dst, "*.out"))
	now := time.Now()
	for _, path := range outs {
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		w.mu.Lock()
		off := w.offs[path]
		w.mu.Unlock()
		if _, err := f.Seek(off, 0); err == nil {
			br := bufio.NewReader(f)
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					break // a line not yet whole is read at the next scan
				}
				off += int64(len(line))
				w.record(line, now)
			}
		}
		f.Close()
		w.mu.Lock()
		w.offs[path] = off
		w.mu.Unlock()
	}
}

func (w *outputWatch) has(line string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.seen[line]
	return ok
}

func (w *outputWatch) close() {
	close(w.stop)
	<-w.done
	w.scan()
}

// latencies are the delays from a line's write to its publication, over
// the lines written at or after from (and before to).
func latencies(in *followInput, out *outputWatch, from, to time.Time) []time.Duration {
	in.mu.Lock()
	defer in.mu.Unlock()
	out.mu.Lock()
	defer out.mu.Unlock()
	var ds []time.Duration
	for line, at := range in.written {
		if at.Before(from) || !at.Before(to) {
			continue
		}
		if seen, ok := out.seen[line]; ok {
			ds = append(ds, seen.Sub(at))
		}
	}
	slices.Sort(ds)
	return ds
}

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}

// Three `spate backfill --follow` workers share a continuous job while
// its input changes and its workers fail: files are created and appended
// to, one is renamed away with a new file at its path, one is truncated
// and written again; workers are SIGKILLed (and started again) and
// SIGSTOPped past their lease (zombies, then SIGCONTed). With the input
// idle, --until-idle ends the job, and spate verify --expect finds every
// line ever written exactly once, on etcd and on Redis. The latency of a
// line from its write to its publication is logged: at steady state (the
// first phase, before any fault), and over the whole run. The output is a
// directory on both stores, and a bucket of the in-process S3 server on
// etcd. CI runs etcd to a bucket and Redis to a directory, each store and
// each output once (etcd to a directory runs in
// TestBackfillWorkersKilledAndStoppedAreExactlyOnce);
// SPATE_PROCESS_MATRIX=full runs all three.
func TestFollowWorkersKilledAndStoppedAreExactlyOnce(t *testing.T) {
	t.Parallel()
	stores := storeCases("etcd", "redis")
	chaos := followChaosFor(t)
	type run struct {
		st storeCase
		to string
	}
	runs := []run{{stores[0], "dir"}, {stores[1], "dir"}, {stores[0], "s3"}}
	// The runs start together, as soon as this test runs, each in a
	// goroutine of its own (each has its own server, input and output),
	// rather than as parallel subtests: those would wait behind every
	// other parallel test of the package, and at 44 s each these are the
	// package's longest (started last, they ended cmd/spate's run 30 s
	// after everything else).
	var wg sync.WaitGroup
	for _, r := range runs {
		if !processMatrix(r.st.name+"/"+r.to, "etcd/s3", "redis/dir") {
			continue
		}
		wg.Go(func() {
			t.Run(r.st.name+"/"+r.to, func(t *testing.T) {
				fr := startFollowRun(t, r.st, r.to)
				fr.write(10 * time.Second) // steady state first: lines appended to followed files, no fault
				fr.steadyTo = time.Now()
				fr.chaos(chaos)
				fr.finish()
				fr.verify()
				fr.reportLatency()
			})
		})
	}
	wg.Wait()
}

// followRun is one run of TestFollowWorkersKilledAndStoppedAreExactlyOnce:
// the input, three workers (and every process started for them), the
// output watch, and what the chaos did.
type followRun struct {
	t        *testing.T
	name     string // store/destination
	dir      string
	src, dst string
	job      string
	store    []string // the store's flags
	in       *followInput
	out      *outputWatch
	ws       []*proc
	started  []*proc // every worker process, the killed ones too
	rng      *rand.Rand
	live     []string // the files the writer appends to

	steadyFrom, steadyTo time.Time
	killed, stopped      int
	truncated, rotated   bool
}

// followLease is the runs' --lease; a stopped worker stays stopped past it.
const followLease = 2 * time.Second

func startFollowRun(t *testing.T, st storeCase, to string) *followRun {
	dir := t.TempDir()
	fr := &followRun{t: t, name: st.name + "/" + to, dir: dir, src: filepath.Join(dir, "src"), dst: filepath.Join(dir, "dst"),
		job: "follow-" + st.name + "-" + to, store: st.args(t), rng: rand.New(rand.NewPCG(1, uint64(len(st.name))))}
	if to == "s3" {
		fr.dst = s3test.Start(t).Bucket(t, "out", "")
	}
	fr.in = newFollowInput(t, fr.src)
	for i := range 3 {
		fr.in.add(fmt.Sprintf("f%d.log", i), fmt.Sprintf("f%d", i), 200)
	}
	fr.ws = []*proc{fr.worker(0), fr.worker(1), fr.worker(2)}
	fr.out = watchOutput(t, fr.dst)
	fr.live = []string{"f0.log", "f1.log", "f2.log"}
	time.Sleep(3 * time.Second) // planned and claimed
	fr.steadyFrom = time.Now()
	return fr
}

// worker starts worker i.
func (fr *followRun) worker(i int) *proc {
	// --log-level info: a rotation, a rename, a truncation are INFO.
	p := start(fr.t, fr.dir, "", append([]string{"backfill", "--follow", "--until-idle", "5s", "--log-level", "info",
		"--src", fr.src, "--dst", fr.dst, "--job", fr.job, "--instance", fmt.Sprintf("w%d", i),
		"--lease", followLease.String()}, fr.store...)...)
	fr.started = append(fr.started, p)
	return p
}

// write appends a few lines to a live file every 20ms for d.
func (fr *followRun) write(d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		name := fr.live[fr.rng.IntN(len(fr.live))]
		fr.in.add(name, fr.in.stream[name], 1+fr.rng.IntN(5))
		time.Sleep(20 * time.Millisecond)
	}
}

// chaos runs for d: new files, kills and stops between seconds of writes,
// a rename a third of the way in and a truncation at two thirds.
func (fr *followRun) chaos(d time.Duration) {
	t := fr.t
	end := time.Now().Add(d)
	for step := 1; time.Now().Before(end); step++ {
		fr.write(time.Second)
		switch {
		case step%3 == 0:
			name := fmt.Sprintf("n%d.log", step)
			fr.in.add(name, strings.TrimSuffix(name, ".log"), 20)
			fr.live = append(fr.live, name)
		case step%5 == 1:
			i := fr.rng.IntN(len(fr.ws))
			require.NoError(t, fr.ws[i].cmd.Process.Kill())
			<-fr.ws[i].done
			fr.ws[i] = fr.worker(i)
			fr.killed++
		case step%5 == 3:
			i := fr.rng.IntN(len(fr.ws))
			select {
			case <-fr.ws[i].done:
			default:
				require.NoError(t, fr.ws[i].cmd.Process.Signal(syscall.SIGSTOP))
				fr.write(followLease + 1500*time.Millisecond)
				require.NoError(t, fr.ws[i].cmd.Process.Signal(syscall.SIGCONT))
				fr.stopped++
			}
		}
		if !fr.rotated && time.Now().After(end.Add(-2*d/3)) {
			fr.rotate()
		}
		if !fr.truncated && time.Now().After(end.Add(-d/3)) {
			fr.truncate()
		}
	}
}

// rotate renames f0.log away; its writer writes on a moment (into
// f0.log.1), then to a new f0.log.
func (fr *followRun) rotate() {
	fr.rotated = true
	require.NoError(fr.t, os.Rename(filepath.Join(fr.src, "f0.log"), filepath.Join(fr.src, "f0.log.1")))
	fr.in.add("f0.log", "f0", 5)
	fr.in.reopen("f0.log")
	fr.in.add("f0.log", "f0b", 5)
	fr.in.stream["f0.log"] = "f0b"
}

// truncate truncates f1.log once all its lines are published, and writes
// it again.
func (fr *followRun) truncate() {
	fr.truncated = true
	fr.live = slices.DeleteFunc(fr.live, func(n string) bool { return n == "f1.log" })
	last := "f1-" + fmt.Sprintf("%07d", fr.in.n["f1"])
	published := func() bool {
		fr.out.mu.Lock()
		defer fr.out.mu.Unlock()
		for l := range fr.out.seen {
			if strings.HasPrefix(l, last+" ") {
				return true
			}
		}
		return false
	}
	// The other files go on growing meanwhile: a bucket publishes a part
	// per roll interval (10 s), longer than --until-idle, which would end
	// the job.
	for deadline := time.Now().Add(time.Minute); !published(); {
		require.True(fr.t, time.Now().Before(deadline), "f1.log's lines were not published before its truncation")
		fr.write(200 * time.Millisecond)
	}
	fr.in.reopen("f1.log")
	require.NoError(fr.t, os.Truncate(filepath.Join(fr.src, "f1.log"), 0))
	fr.in.add("f1.log", "f1b", 30)
	fr.in.stream["f1.log"] = "f1b"
	fr.live = append(fr.live, "f1.log")
}

// finish lets the input go idle, so that --until-idle ends every worker
// with exit 0, and checks the chaos did what it was meant to.
func (fr *followRun) finish() {
	t := fr.t
	fr.in.closeAll()
	for _, w := range fr.ws {
		code := w.wait(t, 3*time.Minute)
		expectCode(t, "worker", code, 0, w.stdout.String(), w.stderr.String())
	}
	fr.out.close()
	all := ""
	for _, w := range fr.started {
		all += w.stdout.String() + w.stderr.String()
	}
	require.True(t, fr.rotated && fr.truncated, "the run was too short to rotate and truncate")
	require.Positive(t, fr.killed, "no worker was killed")
	require.Positive(t, fr.stopped, "no worker was stopped")
	require.Contains(t, all, "was truncated", "no worker saw the truncation")
}

// verify has spate verify --expect find every line ever written exactly
// once.
func (fr *followRun) verify() {
	t := fr.t
	expect := filepath.Join(fr.dir, "expect.txt")
	n := fr.in.ledger(expect)
	code, vout, verr := runSpate(t, fr.dir, "", time.Minute, "verify", "--expect", expect, "--dst", fr.dst)
	t.Logf("%s: %d lines; %d kills, %d stops; %s", fr.name, n, fr.killed, fr.stopped, strings.TrimSpace(vout))
	expectCode(t, "verify", code, 0, vout, verr)
	require.Contains(t, vout, "exactly once: all "+count(int64(n))+" input lines")
}

// reportLatency logs the latency of a line from its write to its
// publication, at steady state and over the whole run, and of a new
// file's first line (found at the leader's next listing: --discover, the
// lease by default).
func (fr *followRun) reportLatency() {
	t, in, out := fr.t, fr.in, fr.out
	steady := latencies(in, out, fr.steadyFrom, fr.steadyTo)
	whole := latencies(in, out, fr.steadyFrom, time.Now())
	require.NotEmpty(t, steady)
	t.Logf("%s: write-to-publish latency at steady state: p50 %v, p99 %v (%d lines); over the whole run: p50 %v, p99 %v, max %v (%d lines)",
		fr.name, quantile(steady, 0.5).Round(time.Millisecond), quantile(steady, 0.99).Round(time.Millisecond), len(steady),
		quantile(whole, 0.5).Round(time.Millisecond), quantile(whole, 0.99).Round(time.Millisecond), whole[len(whole)-1].Round(time.Millisecond), len(whole))
	var firsts []time.Duration
	in.mu.Lock()
	out.mu.Lock()
	for line, at := range in.written {
		if strings.HasPrefix(line, "n") && strings.Contains(line, "-0000001 ") {
			if seen, ok := out.seen[line]; ok {
				firsts = append(firsts, seen.Sub(at))
			}
		}
	}
	out.mu.Unlock()
	in.mu.Unlock()
	slices.Sort(firsts)
	require.NotEmpty(t, firsts)
	t.Logf("%s: a new file's first line published p50 %v, max %v after it was written (%d files; discovery every %v)",
		fr.name, quantile(firsts, 0.5).Round(time.Millisecond), firsts[len(firsts)-1].Round(time.Millisecond), len(firsts), followLease)
}

// A continuous job ends by a signal: the worker hands its splits back,
// prints its summary and exits 0. A later run resumes each followed file
// where its last commit left it, copies what was appended meanwhile, and
// with --until-idle completes: every line once.
func TestFollowStopsOnASignalAndResumes(t *testing.T) {
	t.Parallel()
	c := etcdservers.Start(t, etcdservers.Options{})
	storeArgs := []string{"--store", "etcd://" + c.Members()[0].ClientURL.Host}
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	in := newFollowInput(t, src)
	in.add("a.log", "a", 100)
	args := append([]string{"backfill", "--follow", "--src", src, "--dst", dst, "--job", "follow-signal",
		"--instance", "w0", "--lease", "2s"}, storeArgs...)
	first := start(t, dir, "", args...)
	out := watchOutput(t, dst)
	require.Eventually(t, func() bool { return out.has(fmt.Sprintf("a-%07d %s", 100, strings.Repeat("y", 100%50))) },
		time.Minute, 50*time.Millisecond, "the first lines were not published:\n%s\n%s", first.stdout.String(), first.stderr.String())
	require.NoError(t, first.cmd.Process.Signal(syscall.SIGINT))
	code := first.wait(t, time.Minute)
	expectCode(t, "the interrupted follower", code, 0, first.stdout.String(), first.stderr.String())
	require.Contains(t, first.stdout.String(), "stopped (interrupt) after a graceful hand-back")

	in.add("a.log", "a", 50)
	in.add("b.log", "b", 20)
	in.closeAll()
	second := start(t, dir, "", append(args, "--until-idle", "3s")...)
	code = second.wait(t, 2*time.Minute)
	expectCode(t, "the resumed follower", code, 0, second.stdout.String(), second.stderr.String())
	require.Regexp(t, `gained \S+ \(epoch \d+\) \[follows a.log\], resuming at byte`, second.stdout.String())
	out.close()

	expect := filepath.Join(dir, "expect.txt")
	n := in.ledger(expect)
	vcode, vout, verr := runSpate(t, dir, "", time.Minute, "verify", "--expect", expect, "--dst", dst)
	expectCode(t, "verify", vcode, 0, vout, verr)
	require.Contains(t, vout, "exactly once: all "+count(int64(n))+" input lines")
}
