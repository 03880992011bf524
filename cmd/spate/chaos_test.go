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

// processChaos runs one seeded scenario: three workers on a one-member
// etcd behind fault proxies, six faults, then the judgement.
func processChaos(t *testing.T, seed uint64) (map[string]int, int) {
	pc := newProcessChaos(t, seed)
	obs := pc.observe() // before the first worker writes
	for i := range 3 {
		pc.launch(fmt.Sprintf("i%d", i), faultproxy.New(t, pc.target))
	}
	time.Sleep(2 * time.Second) // planned and claimed
	for range 6 {
		ws := pc.live()
		if len(ws) == 0 {
			break // the job finished early
		}
		pc.inject(ws[pc.rng.IntN(len(ws))])
		time.Sleep(time.Duration(pc.rng.Float64() * float64(processChaosLease)))
	}
	for _, w := range pc.live() {
		w.proxy.Heal()
		w.proxy.SetLatency(0)
	}
	for _, w := range pc.live() {
		code := w.p.wait(t, 3*time.Minute)
		assert.Equal(t, 0, code, "worker %s (%s) exited %d\nstdout:\n%s\nstderr:\n%s", w.name, w.id, code, w.p.stdout.String(), w.p.stderr.String())
	}
	vs := pc.judge(obs)
	for _, v := range vs {
		t.Errorf("seed %d: %s (reproduce with SPATE_PROCESS_CHAOS_SEED=%d)", seed, v, seed)
	}
	pc.keepHistories()
	return pc.faults, len(vs)
}

// processChaosLease is the workers' --lease.
const processChaosLease = 2 * time.Second

// processChaosRun is one scenario of processChaos.
type processChaosRun struct {
	t        *testing.T
	seed     uint64
	rng      *rand.Rand
	c        *etcdservers.Cluster
	target   string // the etcd member's host:port, behind every proxy
	dir      string
	src, dst string
	job      string
	workers  []*chaosWorker // every worker started, the killed ones too
	faults   map[string]int // faults injected, by kind
}

// newProcessChaos starts the store and writes the input.
func newProcessChaos(t *testing.T, seed uint64) *processChaosRun {
	c := etcdservers.Start(t, etcdservers.Options{Members: 1})
	target, err := url.Parse(c.Endpoints()[0])
	require.NoError(t, err)
	dir := t.TempDir()
	pc := &processChaosRun{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 0xc4a05)), c: c, target: target.Host,
		dir: dir, src: filepath.Join(dir, "src"), dst: filepath.Join(dir, "dst"), job: fmt.Sprintf("chaos%d", seed),
		faults: map[string]int{}}
	writeCorpus(t, pc.src, 16, 3000)
	return pc
}

// observe starts the side observer, which reads the store directly, not
// through a proxy.
func (pc *processChaosRun) observe() *conformance.RecordObserver {
	t := pc.t
	cli, err := clientv3.New(pc.c.ClientConfig())
	require.NoError(t, err)
	t.Cleanup(func() { _ = cli.Close() })
	obsStore, err := etcd.New(ctxT(t, 10*time.Second), cli, etcd.Options{Prefix: etcdPrefix(pc.job), TTL: processChaosLease})
	require.NoError(t, err)
	t.Cleanup(func() { _ = obsStore.Close() })
	obs := conformance.NewRecordObserver()
	octx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { obs.Watch(octx, obsStore) })
	t.Cleanup(func() { stop(); wg.Wait() })
	return obs
}

// launch starts a worker with instance id id behind proxy.
func (pc *processChaosRun) launch(id string, proxy *faultproxy.Proxy) {
	gen := len(pc.workers) + 1
	w := &chaosWorker{name: fmt.Sprintf("w%d", gen), id: id, proxy: proxy,
		history: filepath.Join(pc.dir, fmt.Sprintf("w%d.jsonl", gen))}
	w.p = start(pc.t, pc.dir, "", "backfill", "--src", pc.src, "--dst", pc.dst, "--store", "etcd://"+proxy.Addr(),
		"--job", pc.job, "--instance", id, "--lease", processChaosLease.String(), "--commit-interval", "200ms",
		"--rate", "700", "--lanes", "3", "--split-bytes", "65536", "--split-files", "2",
		// The default attempt budget, as in conformance.RunChaos: store
		// faults must never quarantine a split that progresses.
		"--history", w.history, "--log-format", "text", "--log-level", cmp.Or(os.Getenv("SPATE_CHAOS_LOG_LEVEL"), "warn"))
	pc.workers = append(pc.workers, w)
}

// live lists the workers still running and not killed.
func (pc *processChaosRun) live() []*chaosWorker {
	var out []*chaosWorker
	for _, w := range pc.workers {
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

// inject applies one fault, of a kind the seed picks, to w (or to the
// store) for about a lease.
func (pc *processChaosRun) inject(w *chaosWorker) {
	const lease = processChaosLease
	kinds := []string{"sigstop", "blackhole", "cut", "latency", "sigkill-restart", "store-restart"}
	kind := kinds[pc.rng.IntN(len(kinds))]
	pc.faults[kind]++
	d := time.Duration(float64(lease) * (0.5 + pc.rng.Float64()))
	switch kind {
	case "sigstop": // paused past its lease: it comes back a zombie
		_ = w.p.cmd.Process.Signal(syscall.SIGSTOP)
		time.Sleep(lease + d)
		_ = w.p.cmd.Process.Signal(syscall.SIGCONT)
	case "blackhole":
		w.proxy.Blackhole()
		time.Sleep(lease + d)
		w.proxy.Heal()
	case "cut":
		w.proxy.Block()
		time.Sleep(d / 2)
		w.proxy.Heal()
	case "latency":
		w.proxy.SetLatency(150 * time.Millisecond)
		time.Sleep(d)
		w.proxy.SetLatency(0)
	case "sigkill-restart":
		_ = w.p.cmd.Process.Kill()
		<-w.p.done
		w.stopped = true
		pc.launch(w.id, w.proxy)
	case "store-restart":
		pc.c.Kill(0)
		time.Sleep(d / 2)
		require.NoError(pc.t, pc.c.Restart(0), "restart etcd")
	}
}

// judge returns the violations: (a) an input line not in the output
// exactly once, (b) and (e) from the workers' histories, (c) and (b) from
// the store's side.
func (pc *processChaosRun) judge(obs *conformance.RecordObserver) []string {
	t := pc.t
	var vs []string
	res, err := verifyOutput(ctxT(t, time.Minute), filesource.Dir(pc.src), &destination{location: pc.dst, dir: pc.dst})
	require.NoError(t, err)
	if !res.OK() {
		vs = append(vs, fmt.Sprintf("(a) not exactly once: of %d input lines %d are missing, %d duplicated; %d damaged, %d foreign, %d malformed output lines",
			res.InputLines, res.Missing, res.Duplicates, res.Damaged, res.Foreign, res.Malformed))
	}
	var all []histEvent
	for _, w := range pc.workers {
		all = append(all, readHistory(t, w.history)...)
	}
	vs = append(vs, checkCommitsAndResumes(all)...)
	time.Sleep(500 * time.Millisecond) // let the observer catch up
	vs = append(vs, obs.Violations()...)
	t.Logf("seed %d: faults %v; %d workers ran; %d history events; %d record versions observed; %d missing, %d duplicates",
		pc.seed, pc.faults, len(pc.workers), len(all), obs.Versions(), res.Missing, res.Duplicates)
	return vs
}

// keepHistories copies the workers' histories and stderr to
// $SPATE_CHAOS_KEEP/seed-N, when it is set.
func (pc *processChaosRun) keepHistories() {
	keep := os.Getenv("SPATE_CHAOS_KEEP")
	if keep == "" {
		return
	}
	to := filepath.Join(keep, fmt.Sprintf("seed-%d", pc.seed))
	_ = os.MkdirAll(to, 0o755)
	for _, w := range pc.workers {
		if b, err := os.ReadFile(w.history); err == nil {
			_ = os.WriteFile(filepath.Join(to, filepath.Base(w.history)), b, 0o644)
		}
		_ = os.WriteFile(filepath.Join(to, w.name+".stderr"), []byte(w.p.stderr.String()), 0o644)
	}
	pc.t.Logf("histories kept in %s", to)
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
