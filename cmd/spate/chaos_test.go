package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/internal/etcdservers"
	"github.com/spate-go/spate/internal/faultproxy"
	"github.com/spate-go/spate/pipeline/filesource"
	"github.com/spate-go/spate/stores/etcd"
)

// TestProcessChaos runs real `spate backfill` worker processes against an
// etcd they reach through fault proxies, and injects process and network
// faults while they work: SIGSTOP/SIGCONT (a paused owner that comes back as
// a zombie), SIGKILL and a restart with the same instance id, a blackholed
// connection (a partition), cut connections, added latency, and the etcd
// server killed and restarted. It then checks the outcome from the
// workers' histories, their output and a side observer of the store:
//
//	(a) no input line is lost;
//	(b) no committed watermark regresses;
//	(c) no write by a non-owner is visible in the store;
//	(e) every tenancy resumes between the last commit acknowledged to an
//	    earlier one and the furthest attempted, so duplicates come only
//	    from uncommitted tails.
//
// Linearizability of the split records, (d), is checked in-process by
// conformance.RunChaos, where every store operation is recorded.
// SPATE_PROCESS_CHAOS_SEEDS=n runs n seeds (one by default); a failing seed
// reproduces with SPATE_PROCESS_CHAOS_SEED.
func TestProcessChaos(t *testing.T) {
	t.Parallel()
	seeds := []uint64{1}
	if n, err := strconv.Atoi(os.Getenv("SPATE_PROCESS_CHAOS_SEEDS")); err == nil && n > 0 {
		seeds = seeds[:0]
		for i := range n {
			seeds = append(seeds, uint64(i+1))
		}
	}
	if s, err := strconv.ParseUint(os.Getenv("SPATE_PROCESS_CHAOS_SEED"), 10, 64); err == nil {
		seeds = []uint64{s}
	}
	var mu sync.Mutex
	total := map[string]int{}
	scenarios, violations := 0, 0
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			faults, v := processChaos(t, seed)
			mu.Lock()
			defer mu.Unlock()
			scenarios++
			violations += v
			for k, n := range faults {
				total[k] += n
			}
		})
	}
	n := 0
	for _, v := range total {
		n += v
	}
	t.Logf("process chaos summary: %d scenarios, %d faults injected %v, %d violations", scenarios, n, total, violations)
}

type chaosWorker struct {
	name, id, history string
	p                 *proc
	proxy             *faultproxy.Proxy
	stopped           bool
}

func processChaos(t *testing.T, seed uint64) (map[string]int, int) {
	rng := rand.New(rand.NewPCG(seed, 0xc4a05))
	const lease = 2 * time.Second
	c := etcdservers.Start(t, etcdservers.Options{Members: 1})
	target, err := url.Parse(c.Endpoints()[0])
	require.NoError(t, err)
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	writeCorpus(t, src, 16, 3000)
	job := fmt.Sprintf("chaos%d", seed)

	// The side observer reads the store directly, not through a proxy.
	cli, err := clientv3.New(c.ClientConfig())
	require.NoError(t, err)
	defer cli.Close()
	obsStore, err := etcd.New(ctxT(t, 10*time.Second), cli, etcd.Options{Prefix: etcdPrefix(job), TTL: lease})
	require.NoError(t, err)
	defer obsStore.Close()
	obs := conformance.NewRecordObserver()
	octx, stopObs := context.WithCancel(context.Background())
	var owg sync.WaitGroup
	owg.Go(func() { obs.Watch(octx, obsStore) })
	defer func() { stopObs(); owg.Wait() }()

	gen := 0
	launch := func(id string, proxy *faultproxy.Proxy) *chaosWorker {
		gen++
		w := &chaosWorker{name: fmt.Sprintf("w%d", gen), id: id, proxy: proxy,
			history: filepath.Join(dir, fmt.Sprintf("w%d.jsonl", gen))}
		w.p = start(t, dir, "", "backfill", "--src", src, "--dst", dst, "--store", "etcd://"+proxy.Addr(),
			"--job", job, "--instance", id, "--lease", lease.String(), "--commit-interval", "200ms",
			"--rate", "700", "--lanes", "3", "--split-bytes", "65536", "--split-files", "2",
			// The default attempt budget, as in conformance.RunChaos: store
			// faults must never quarantine a split that progresses.
			"--history", w.history, "--log-format", "text", "--log-level", cmp.Or(os.Getenv("SPATE_CHAOS_LOG_LEVEL"), "warn"))
		return w
	}
	var workers []*chaosWorker
	for i := range 3 {
		workers = append(workers, launch(fmt.Sprintf("i%d", i), faultproxy.New(t, target.Host)))
	}
	time.Sleep(2 * time.Second) // planned and claimed
	faults := map[string]int{}
	live := func() []*chaosWorker {
		var out []*chaosWorker
		for _, w := range workers {
			select {
			case <-w.p.done:
			default:
				if !w.stopped {
					out = append(out, w)
				}
			}
		}
		return out
	}
	hold := func(d time.Duration) { time.Sleep(d) }
	for range 6 {
		ws := live()
		if len(ws) == 0 {
			break // the job finished early
		}
		w := ws[rng.IntN(len(ws))]
		kinds := []string{"sigstop", "blackhole", "cut", "latency", "sigkill-restart", "store-restart"}
		kind := kinds[rng.IntN(len(kinds))]
		faults[kind]++
		d := time.Duration(float64(lease) * (0.5 + rng.Float64()))
		switch kind {
		case "sigstop": // paused past its lease: it comes back a zombie
			_ = w.p.cmd.Process.Signal(syscall.SIGSTOP)
			hold(lease + d)
			_ = w.p.cmd.Process.Signal(syscall.SIGCONT)
		case "blackhole":
			w.proxy.Blackhole()
			hold(lease + d)
			w.proxy.Heal()
		case "cut":
			w.proxy.Block()
			hold(d / 2)
			w.proxy.Heal()
		case "latency":
			w.proxy.SetLatency(150 * time.Millisecond)
			hold(d)
			w.proxy.SetLatency(0)
		case "sigkill-restart":
			_ = w.p.cmd.Process.Kill()
			<-w.p.done
			w.stopped = true
			workers = append(workers, launch(w.id, w.proxy))
		case "store-restart":
			c.Kill(0)
			hold(d / 2)
			require.NoError(t, c.Restart(0), "restart etcd")
		}
		hold(time.Duration(rng.Float64() * float64(lease)))
	}
	for _, w := range live() {
		w.proxy.Heal()
		w.proxy.SetLatency(0)
	}
	for _, w := range live() {
		code := w.p.wait(t, 3*time.Minute)
		assert.Equal(t, 0, code, "worker %s (%s) exited %d\nstdout:\n%s\nstderr:\n%s", w.name, w.id, code, w.p.stdout.String(), w.p.stderr.String())
	}

	var vs []string
	// (a) every input line reached the output exactly once.
	res, err := verifyOutput(ctxT(t, time.Minute), filesource.Dir(src), &destination{location: dst, dir: dst})
	require.NoError(t, err)
	if !res.OK() {
		vs = append(vs, fmt.Sprintf("(a) not exactly once: of %d input lines %d are missing, %d duplicated; %d damaged, %d foreign, %d malformed output lines",
			res.InputLines, res.Missing, res.Duplicates, res.Damaged, res.Foreign, res.Malformed))
	}
	// (b), (e) from the histories.
	var all []histEvent
	for _, w := range workers {
		all = append(all, readHistory(t, w.history)...)
	}
	vs = append(vs, checkCommitsAndResumes(all)...)
	// (c) and (b) from the store's side.
	time.Sleep(500 * time.Millisecond) // let the observer catch up
	vs = append(vs, obs.Violations()...)
	for _, v := range vs {
		t.Errorf("seed %d: %s (reproduce with SPATE_PROCESS_CHAOS_SEED=%d)", seed, v, seed)
	}
	if keep := os.Getenv("SPATE_CHAOS_KEEP"); keep != "" || len(vs) > 0 && keep != "" {
		to := filepath.Join(keep, fmt.Sprintf("seed-%d", seed))
		_ = os.MkdirAll(to, 0o755)
		for _, w := range workers {
			if b, err := os.ReadFile(w.history); err == nil {
				_ = os.WriteFile(filepath.Join(to, filepath.Base(w.history)), b, 0o644)
			}
			_ = os.WriteFile(filepath.Join(to, w.name+".stderr"), []byte(w.p.stderr.String()), 0o644)
		}
		t.Logf("histories kept in %s", to)
	}
	t.Logf("seed %d: faults %v; %d workers ran; %d history events; %d record versions observed; %d missing, %d duplicates",
		seed, faults, len(workers), len(all), obs.Versions(), res.Missing, res.Duplicates)
	return faults, len(vs)
}

// histEvent is the part of a --history line the checks use.
type histEvent struct {
	TS        time.Time `json:"ts"`
	Instance  string    `json:"instance"`
	Ev        string    `json:"ev"`
	Split     string    `json:"split"`
	Epoch     uint64    `json:"epoch"`
	Resume    *int64    `json:"resume"`
	Watermark int64     `json:"watermark"`
	Outcome   string    `json:"outcome"`
}

func readHistory(t *testing.T, path string) []histEvent {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err, "history")
	defer f.Close()
	var out []histEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e histEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// A process killed mid-write can leave a torn last line.
			continue
		}
		out = append(out, e)
	}
	return out
}

// checkCommitsAndResumes checks (b) on the acknowledged commits across
// workers, in time order, and (e) on every gain.
func checkCommitsAndResumes(all []histEvent) []string {
	sort.SliceStable(all, func(i, j int) bool { return all[i].TS.Before(all[j].TS) })
	var vs []string
	lastOK := map[string]histEvent{}
	for _, e := range all {
		if e.Ev != "commit" || e.Outcome != "ok" {
			continue
		}
		if p, ok := lastOK[e.Split]; ok && e.Watermark < p.Watermark && e.Epoch >= p.Epoch {
			vs = append(vs, fmt.Sprintf("(b) split %s: %s committed %d at epoch %d after %s's %d at epoch %d",
				e.Split, e.Instance, e.Watermark, e.Epoch, p.Instance, p.Watermark, p.Epoch))
		}
		lastOK[e.Split] = e
	}
	for _, g := range all {
		if g.Ev != "gained" {
			continue
		}
		lo, hi := int64(-1), int64(-1)
		for _, e := range all {
			if e.Ev == "commit" && e.Split == g.Split && e.Epoch < g.Epoch {
				hi = max(hi, e.Watermark)
				if e.Outcome == "ok" {
					lo = max(lo, e.Watermark)
				}
			}
		}
		got := int64(-1)
		if g.Resume != nil {
			got = *g.Resume
		}
		if got < lo || got > hi {
			vs = append(vs, fmt.Sprintf("(e) %s gained %s at epoch %d resuming at %d, outside [%d, %d]",
				g.Instance, g.Split, g.Epoch, got, lo, hi))
		}
	}
	return vs
}
