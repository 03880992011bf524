// Command rangescan is a library user's own coordinated job, in one file: a
// range scan of ids [0, -ids) cut into -splits weighted splits, run by
// -workers pipeline workers in this process over one coordination store,
// written exactly once to -dst by filesink.StagedFileSink, then verified.
//
//	go run ./examples/rangescan                       # in-memory store
//	go run ./examples/rangescan -store redis://127.0.0.1:6379 -dst /tmp/scan
//
// The custom source is the part a user writes: a planner (Fingerprint,
// Plan), a SplitSource (OpenSplit, EncodeCommit, Sweep, CloseSplit; the rest
// from pipeline.BaseSplitSource) and a Lane that reads its split from the
// resume watermark and decides end of input on an empty poll.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesink"
	_ "github.com/spate-go/spate/stores/etcd"
	_ "github.com/spate-go/spate/stores/mem"
	_ "github.com/spate-go/spate/stores/nats"
	_ "github.com/spate-go/spate/stores/redis"
	"github.com/spate-go/spate/storeurl"
)

// scanPlanner cuts [0, ids) into splits of growing size, so their weights
// differ (the assignment balances weight, not count).
type scanPlanner struct{ ids, splits int64 }

func (p scanPlanner) Fingerprint() string {
	return fmt.Sprintf("rangescan:v1:%d:%d", p.ids, p.splits)
}

func (p scanPlanner) Plan(context.Context, spate.PlanContext) (spate.SplitPlan, error) {
	var out []spate.PlannedSplit
	// Split i gets a share proportional to i+1.
	total := p.splits * (p.splits + 1) / 2
	var lo int64
	for i := range p.splits {
		hi := lo + p.ids*(i+1)/total
		if i == p.splits-1 {
			hi = p.ids
		}
		desc := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, uint64(lo)), uint64(hi))
		id := spate.MustSplitID(fmt.Sprintf("ids-%07d-%07d", lo, hi))
		out = append(out, spate.NewPlannedSplit(spate.NewSplitSpec(id, desc).WithWeight(uint64(max(hi-lo, 1)))))
		lo = hi
	}
	return spate.NewSplitPlan(out, spate.PlanFinal), nil
}

func bounds(spec spate.SplitSpec) (lo, hi int64, err error) {
	if len(spec.Descriptor) != 16 {
		return 0, 0, fmt.Errorf("split %s: descriptor of %d bytes, want 16", spec.ID, len(spec.Descriptor))
	}
	return int64(binary.BigEndian.Uint64(spec.Descriptor)), int64(binary.BigEndian.Uint64(spec.Descriptor[8:])), nil
}

// scanSource is the SplitSource. Watermarks are split-relative: the
// number of ids of the split delivered.
type scanSource struct {
	pipeline.BaseSplitSource
	mu    sync.Mutex
	lanes map[spate.SplitID]*scanLane
}

func (s *scanSource) OpenSplit(o pipeline.SplitOpening) (pipeline.Lane, error) {
	lo, hi, err := bounds(o.Spec)
	if err != nil {
		return nil, err
	}
	l := &scanLane{id: o.Lane, part: o.Partition, issuer: o.Issuer, lo: lo, n: hi - lo}
	if o.Progress != nil {
		l.next = o.Progress.Watermark
	}
	s.mu.Lock()
	s.lanes[o.Spec.ID] = l
	s.mu.Unlock()
	return l, nil
}

// EncodeCommit reports completion once every id of the split is
// acknowledged.
func (s *scanSource) EncodeCommit(split spate.SplitID, watermark int64) (spate.SplitProgress, error) {
	s.mu.Lock()
	l := s.lanes[split]
	s.mu.Unlock()
	if l != nil && watermark >= l.end() {
		return spate.CompletedProgress(watermark, nil), nil
	}
	return spate.NewSplitProgress(watermark, nil), nil
}

// Sweep completes a split with nothing to read (resumed at its end).
func (s *scanSource) Sweep(split spate.SplitID) (*spate.SplitProgress, error) {
	s.mu.Lock()
	l := s.lanes[split]
	s.mu.Unlock()
	if l != nil && l.started() == l.end() && l.emitted() == 0 {
		p := spate.CompletedProgress(l.end(), nil)
		return &p, nil
	}
	return nil, nil
}

func (s *scanSource) CloseSplit(split spate.SplitID) {
	s.mu.Lock()
	delete(s.lanes, split)
	s.mu.Unlock()
}

// TrySplit implements pipeline.SplitDivider: the lane stops at position,
// or at the id after the last it read if it read past position, and gives
// up the rest of its range. Positions are split-relative, like its
// watermarks; the lane's lock serializes it with the lane's reads.
func (s *scanSource) TrySplit(split spate.SplitID, position int64) (spate.Division, bool) {
	s.mu.Lock()
	l := s.lanes[split]
	s.mu.Unlock()
	if l == nil {
		return spate.Division{}, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	pos := max(position, l.next)
	if pos >= l.n || l.whole != 0 {
		return spate.Division{}, false // nothing to give, or a division in flight
	}
	l.whole, l.n = l.n, pos
	desc := func(a, b int64) []byte {
		return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, uint64(l.lo+a)), uint64(l.lo+b))
	}
	return spate.Division{Position: pos, Primary: desc(0, pos), PrimaryWeight: uint64(max(pos, 1)),
		Residual: desc(pos, l.whole), ResidualWeight: uint64(l.whole - pos)}, true
}

// SplitDone implements pipeline.SplitDivider: a refused division gives the
// lane its whole range back.
func (s *scanSource) SplitDone(split spate.SplitID, _ spate.Division, kept bool) {
	s.mu.Lock()
	l := s.lanes[split]
	s.mu.Unlock()
	if l == nil {
		return
	}
	l.mu.Lock()
	if !kept {
		l.n = l.whole
	}
	l.whole = 0
	l.mu.Unlock()
}

// scanLane reads ids lo+next .. lo+n-1. An empty poll past the end is the
// end of input (the lane just returns no batch).
type scanLane struct {
	id     pipeline.LaneID
	part   pipeline.PartitionID
	issuer *pipeline.AckIssuer
	lo, n  int64

	mu        sync.Mutex
	next      int64 // split-relative offset of the next id to read
	whole     int64 // n before a division in flight (0: none)
	resumedAt int64
	polled    bool
	payloads  []pipeline.RawPayload
}

func (l *scanLane) ID() pipeline.LaneID             { return l.id }
func (l *scanLane) Partition() pipeline.PartitionID { return l.part }

func (l *scanLane) started() int64 { l.mu.Lock(); defer l.mu.Unlock(); return l.next }
func (l *scanLane) end() int64     { l.mu.Lock(); defer l.mu.Unlock(); return l.n }
func (l *scanLane) emitted() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.polled {
		l.resumedAt = l.next
	}
	return l.next - l.resumedAt
}

func (l *scanLane) Poll(maxRecords int, timeout time.Duration) (*pipeline.Batch, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.polled {
		l.polled, l.resumedAt = true, l.next
	}
	if l.next >= l.n {
		time.Sleep(timeout) // end of input: idle, never spin
		return nil, nil
	}
	l.payloads = l.payloads[:0]
	for l.next < l.n && len(l.payloads) < maxRecords {
		id := l.lo + l.next
		l.payloads = append(l.payloads, pipeline.RawPayload{
			Key: strconv.AppendInt(nil, id, 10), Value: fmt.Appendf(nil, "row %d", id),
			Partition: l.part, Offset: l.next,
		})
		l.next++
	}
	return &pipeline.Batch{Payloads: l.payloads, Ack: l.issuer.Issue(l.part, l.next-1)}, nil
}

// options is one run of the job.
type options struct {
	store   string
	job     string
	dst     string
	ids     int64
	splits  int64
	workers int
	lease   time.Duration
	// atLeastOnce writes through the plain FileSink (one file per worker
	// and shard): a moved or taken-over split replays its uncommitted tail.
	atLeastOnce bool
	// late workers join the fleet lateAfter after the others start.
	late      int
	lateAfter time.Duration
	// started is told each worker's instance id as it is made.
	started func(instance string)
	// wrap lets a test wrap each worker's source (to count calls).
	wrap func(pipeline.SplitSource) pipeline.SplitSource
	log  *slog.Logger
}

// run runs the workers to the job's end and returns their exit reports.
func run(ctx context.Context, o options) ([]pipeline.ExitReport, error) {
	dep, err := storeurl.Open(ctx, o.store, storeurl.Options{})
	if err != nil {
		return nil, err
	}
	defer dep.Close()
	reports := make([]pipeline.ExitReport, o.workers+o.late)
	errs := make([]error, o.workers+o.late)
	var wg sync.WaitGroup
	for i := range o.workers + o.late {
		st, err := dep.Open(ctx, o.job, o.lease)
		if err != nil {
			return nil, err
		}
		defer st.Close()
		// The library's defaults: a generated instance id, so a worker that
		// dies never holds its splits back for a rebalance delay.
		cfg := spate.TimingsForLease(o.lease)
		coord, err := spate.NewStoreCoordinator(st, cfg, spate.WithLogger(o.log))
		if err != nil {
			return nil, err
		}
		defer coord.Close()
		name := coord.InstanceID()
		if o.started != nil {
			o.started(name)
		}
		var src pipeline.SplitSource = &scanSource{lanes: map[spate.SplitID]*scanLane{}}
		if o.wrap != nil {
			src = o.wrap(src)
		}
		var sink interface {
			pipeline.Sink
			Close() error
		}
		if o.atLeastOnce {
			sink, err = filesink.NewFileSink(o.dst, name)
		} else {
			sink, err = filesink.NewStagedFileSink(o.dst, o.job)
		}
		if err != nil {
			return nil, err
		}
		defer sink.Close()
		rt, err := pipeline.Build(pipeline.Config{Name: name, CommitInterval: 200 * time.Millisecond},
			pipeline.NewCoordinatedSource(coord, src, scanPlanner{ids: o.ids, splits: o.splits}, pipeline.DriverLogger(o.log.With("worker", name))),
			nil, []pipeline.SinkSpec{{Name: "file", Sink: sink}}, pipeline.WithLogger(o.log.With("worker", name)))
		if err != nil {
			return nil, err
		}
		wg.Go(func() {
			if i >= o.workers {
				select {
				case <-time.After(o.lateAfter):
				case <-ctx.Done():
				}
			}
			reports[i], errs[i] = rt.Run(ctx)
		})
	}
	wg.Wait()
	return reports, errors.Join(errs...)
}

// verify counts, over dst's published files, the ids of [0, ids) missing
// and written more than once, and the lines that are no id of the range.
func verify(dst string, ids int64) (missing, dups, alien int64, err error) {
	seen := make([]uint8, ids)
	outs, err := filepath.Glob(filepath.Join(dst, "*.out"))
	if err != nil {
		return 0, 0, 0, err
	}
	for _, path := range outs {
		f, err := os.Open(path)
		if err != nil {
			return 0, 0, 0, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			key, _, _ := strings.Cut(sc.Text(), "\t")
			id, err := strconv.ParseInt(key, 10, 64)
			if err != nil || id < 0 || id >= ids {
				alien++
				continue
			}
			if seen[id] < 255 {
				seen[id]++
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return 0, 0, 0, err
		}
	}
	for _, n := range seen {
		switch {
		case n == 0:
			missing++
		case n > 1:
			dups += int64(n) - 1
		}
	}
	return missing, dups, alien, nil
}

func main() {
	var o options
	flag.StringVar(&o.store, "store", "mem://", "coordination store URL")
	flag.StringVar(&o.job, "job", "rangescan", "job name")
	flag.StringVar(&o.dst, "dst", "", "output directory (default: a new temporary directory)")
	flag.Int64Var(&o.ids, "ids", 1_000_000, "ids to scan")
	flag.Int64Var(&o.splits, "splits", 40, "splits")
	flag.IntVar(&o.workers, "workers", 3, "workers")
	flag.DurationVar(&o.lease, "lease", 3*time.Second, "lease duration")
	flag.BoolVar(&o.atLeastOnce, "at-least-once", false, "write through the plain (at-least-once) FileSink instead of the staging one")
	flag.Parse()
	o.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("SPATE_LOG") != "" {
		o.log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if o.dst == "" {
		d, err := os.MkdirTemp("", "rangescan-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		o.dst = d
	}
	start := time.Now()
	if _, err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "rangescan:", err)
		os.Exit(1)
	}
	missing, dups, alien, err := verify(o.dst, o.ids)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rangescan: verify:", err)
		os.Exit(1)
	}
	fmt.Printf("%d ids in %d splits by %d workers in %v into %s: %d missing, %d duplicates, %d alien\n",
		o.ids, o.splits, o.workers, time.Since(start).Round(time.Millisecond), o.dst, missing, dups, alien)
	if missing+alien > 0 || dups > 0 && !o.atLeastOnce {
		os.Exit(1)
	}
	if dups == 0 {
		fmt.Println("exactly once")
	}
}
