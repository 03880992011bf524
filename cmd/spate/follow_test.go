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
// etcd.
func TestFollowWorkersKilledAndStoppedAreExactlyOnce(t *testing.T) {
	t.Parallel()
	stores := storeCases("etcd", "redis")
	chaos := followChaosFor(t)
	type run struct {
		st storeCase
		to string
	}
	runs := []run{{stores[0], "dir"}, {stores[1], "dir"}, {stores[0], "s3"}}
	for _, r := range runs {
		st := r.st
		t.Run(st.name+"/"+r.to, func(t *testing.T) {
			storeArgs := st.args(t)
			dir := t.TempDir()
			src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
			if r.to == "s3" {
				dst = s3test.Start(t).Bucket(t, "out", "")
			}
			in := newFollowInput(t, src)
			for i := range 3 {
				in.add(fmt.Sprintf("f%d.log", i), fmt.Sprintf("f%d", i), 200)
			}
			const lease = 2 * time.Second
			job := "follow-" + st.name + "-" + r.to
			var started []*proc // every worker process, the killed ones too
			worker := func(i int) *proc {
				p := start(t, dir, "", append([]string{"backfill", "--follow", "--until-idle", "5s",
					"--src", src, "--dst", dst, "--job", job, "--instance", fmt.Sprintf("w%d", i),
					"--lease", lease.String()}, storeArgs...)...)
				started = append(started, p)
				return p
			}
			ws := []*proc{worker(0), worker(1), worker(2)}
			out := watchOutput(t, dst)

			// Steady state first: lines appended to followed files, no fault.
			rng := rand.New(rand.NewPCG(1, uint64(len(st.name))))
			live := []string{"f0.log", "f1.log", "f2.log"}
			write := func(d time.Duration) {
				end := time.Now().Add(d)
				for time.Now().Before(end) {
					name := live[rng.IntN(len(live))]
					in.add(name, in.stream[name], 1+rng.IntN(5))
					time.Sleep(20 * time.Millisecond)
				}
			}
			time.Sleep(3 * time.Second) // planned and claimed
			steadyFrom := time.Now()
			write(10 * time.Second)
			steadyTo := time.Now()

			// Chaos: new files, a rename, a truncation, kills and stops.
			chaosEnd := time.Now().Add(chaos)
			step := 0
			var killed, stopped int
			var truncated, rotated bool
			for time.Now().Before(chaosEnd) {
				step++
				write(time.Second)
				switch {
				case step%3 == 0:
					name := fmt.Sprintf("n%d.log", step)
					in.add(name, strings.TrimSuffix(name, ".log"), 20)
					live = append(live, name)
				case step%5 == 1:
					i := rng.IntN(len(ws))
					require.NoError(t, ws[i].cmd.Process.Kill())
					<-ws[i].done
					ws[i] = worker(i)
					killed++
				case step%5 == 3:
					i := rng.IntN(len(ws))
					select {
					case <-ws[i].done:
					default:
						require.NoError(t, ws[i].cmd.Process.Signal(syscall.SIGSTOP))
						write(lease + 1500*time.Millisecond)
						require.NoError(t, ws[i].cmd.Process.Signal(syscall.SIGCONT))
						stopped++
					}
				}
				if !rotated && time.Now().After(chaosEnd.Add(-2*chaos/3)) {
					// f0.log renamed away; its writer writes on a moment
					// (into f0.log.1), then to a new f0.log.
					rotated = true
					require.NoError(t, os.Rename(filepath.Join(src, "f0.log"), filepath.Join(src, "f0.log.1")))
					in.add("f0.log", "f0", 5)
					in.reopen("f0.log")
					in.add("f0.log", "f0b", 5)
					in.stream["f0.log"] = "f0b"
				}
				if !truncated && time.Now().After(chaosEnd.Add(-chaos/3)) {
					// f1.log truncated once all its lines are published.
					truncated = true
					live = slices.DeleteFunc(live, func(n string) bool { return n == "f1.log" })
					last := "f1-" + fmt.Sprintf("%07d", in.n["f1"])
					published := func() bool {
						out.mu.Lock()
						defer out.mu.Unlock()
						for l := range out.seen {
							if strings.HasPrefix(l, last+" ") {
								return true
							}
						}
						return false
					}
					// The other files go on growing meanwhile: a bucket
					// publishes a part per roll interval (10 s), longer
					// than --until-idle, which would end the job.
					for deadline := time.Now().Add(time.Minute); !published(); {
						require.True(t, time.Now().Before(deadline), "f1.log's lines were not published before its truncation")
						write(200 * time.Millisecond)
					}
					in.reopen("f1.log")
					require.NoError(t, os.Truncate(filepath.Join(src, "f1.log"), 0))
					in.add("f1.log", "f1b", 30)
					in.stream["f1.log"] = "f1b"
					live = append(live, "f1.log")
				}
			}
			in.closeAll()
			for _, w := range ws {
				code := w.wait(t, 3*time.Minute)
				expectCode(t, "worker", code, 0, w.stdout.String(), w.stderr.String())
			}
			out.close()
			all := ""
			for _, w := range started {
				all += w.stdout.String() + w.stderr.String()
			}
			require.True(t, rotated && truncated, "the run was too short to rotate and truncate")
			require.Positive(t, killed, "no worker was killed")
			require.Positive(t, stopped, "no worker was stopped")
			require.Contains(t, all, "was truncated", "no worker saw the truncation")

			expect := filepath.Join(dir, "expect.txt")
			n := in.ledger(expect)
			code, vout, verr := runSpate(t, dir, "", time.Minute, "verify", "--expect", expect, "--dst", dst)
			t.Logf("%s/%s: %d lines; %d kills, %d stops; %s", st.name, r.to, n, killed, stopped, strings.TrimSpace(vout))
			expectCode(t, "verify", code, 0, vout, verr)
			require.Contains(t, vout, "exactly once: all "+count(int64(n))+" input lines")

			steady := latencies(in, out, steadyFrom, steadyTo)
			whole := latencies(in, out, steadyFrom, time.Now())
			require.NotEmpty(t, steady)
			t.Logf("%s/%s: write-to-publish latency at steady state: p50 %v, p99 %v (%d lines); over the whole run: p50 %v, p99 %v, max %v (%d lines)",
				st.name, r.to, quantile(steady, 0.5).Round(time.Millisecond), quantile(steady, 0.99).Round(time.Millisecond), len(steady),
				quantile(whole, 0.5).Round(time.Millisecond), quantile(whole, 0.99).Round(time.Millisecond), whole[len(whole)-1].Round(time.Millisecond), len(whole))
			// A new file is found at the leader's next listing (--discover,
			// the lease by default): its first line's latency.
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
			t.Logf("%s/%s: a new file's first line published p50 %v, max %v after it was written (%d files; discovery every %v)",
				st.name, r.to, quantile(firsts, 0.5).Round(time.Millisecond), firsts[len(firsts)-1].Round(time.Millisecond), len(firsts), lease)
		})
	}
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
