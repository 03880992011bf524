package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesource"
	"github.com/spate-go/spate/pipeline/pgsource"
)

// history appends JSON lines to the --history file: one object per line,
// written with a single write each (O_APPEND), so a line is complete in the
// file even if the process is killed right after. Lines are not fsynced: they
// survive the process, not the machine. See the package doc for the schema.
type history struct {
	mu       sync.Mutex
	f        *os.File
	instance string
	err      error
}

func openHistory(path, instance string) (*history, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--history: %w", err)
	}
	return &history{f: f, instance: instance}, nil
}

// record appends one event: {"ts":...,"instance":...,"ev":...} followed by
// fields in key order.
func (h *history) record(ev string, fields map[string]any) {
	if h == nil {
		return
	}
	head, err := json.Marshal(struct {
		TS       string `json:"ts"`
		Instance string `json:"instance"`
		Ev       string `json:"ev"`
	}{time.Now().UTC().Format(time.RFC3339Nano), h.instance, ev})
	if err != nil {
		return
	}
	b := head
	if len(fields) > 0 {
		rest, err := json.Marshal(fields)
		if err != nil {
			return
		}
		b = append(b[:len(b)-1], ',')
		b = append(b, rest[1:]...)
	}
	b = append(b, '\n')
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, err := h.f.Write(b); err != nil && h.err == nil {
		h.err = err
	}
}

func (h *history) close() error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	err := h.f.Close()
	if h.err != nil {
		return h.err
	}
	return err
}

// splitInfo is what the observer knows about a split it held.
type splitInfo struct {
	files     []filesource.Member
	total     int64
	rng       *filesource.Range // a range split's part of its file
	epoch     spate.LeaseEpoch
	completed bool
	poison    string
	revoked   bool // the leader asked for it back (a planned rebalance)
	// tail is a followed file's split descriptor (nil for other splits),
	// found the name the planner found the file under; files[0].Name is
	// where the file is now, as the last commit seen says.
	tail  []byte
	found string
	end   string // why a followed file's split completed
	// chunk is a table's chunk as people read it (its key range and
	// rows), "" for a split of files.
	chunk string
}

// describe names s's files for people: a followed file by where it is
// now, and the name it was found under when it was renamed since.
func (s *splitInfo) describe() string {
	if s.chunk != "" {
		return s.chunk
	}
	d := describeFiles(s.files, s.total, s.rng)
	if s.tail != nil && len(s.files) == 1 && s.found != "" && s.found != s.files[0].Name {
		d += " (found as " + s.found + ")"
	}
	return d
}

// followed updates a followed file's current name and end from progress.
func (s *splitInfo) followed(p *spate.SplitProgress) {
	if s.tail == nil || len(s.files) != 1 {
		return
	}
	if f, ok := filesource.FollowedOf(s.tail, p); ok {
		s.files[0].Name, s.found, s.end = f.Name, f.Found, f.End
	}
}

// tenancyRef maps a pipeline partition to the split tenancy it carries.
type tenancyRef struct {
	split spate.SplitID
	epoch spate.LeaseEpoch
}

// observer sees everything a backfill worker does: coordinator events and
// commands (through observedCoord), lane openings (observedSplits) and
// durable sink writes (outputSink). It prints event lines, keeps the
// summary's counters and writes the history.
type observer struct {
	con  *console
	hist *history
	// table: the splits are a table's chunks (rows, key ranges), not
	// byte ranges of files.
	table bool

	mu          sync.Mutex
	splits      map[spate.SplitID]*splitInfo
	parts       map[pipeline.PartitionID]tenancyRef
	gained      int
	resumed     int
	lost        int
	completed   int
	handedBack  int
	quarantined []spate.SplitID
	allComplete bool
	stalled     *spate.Stalled

	records atomic.Int64 // lines written durably by this worker
	bytes   atomic.Int64 // their input bytes (line plus newline)
}

func newObserver(con *console, hist *history) *observer {
	return &observer{con: con, hist: hist, splits: map[spate.SplitID]*splitInfo{}, parts: map[pipeline.PartitionID]tenancyRef{}}
}

func (o *observer) info(id spate.SplitID) *splitInfo {
	s := o.splits[id]
	if s == nil {
		s = &splitInfo{}
		o.splits[id] = s
	}
	return s
}

// describeFiles names a split's files for people.
func describeFiles(files []filesource.Member, total int64, rng *filesource.Range) string {
	if rng != nil && len(files) == 1 {
		return fmt.Sprintf("%s bytes %d..%d of %s", files[0].Name, rng.Start, rng.End, bytesStr(files[0].Size))
	}
	switch len(files) {
	case 0:
		return "no files"
	case 1:
		if files[0].Size < 0 {
			return "follows " + files[0].Name
		}
		return fmt.Sprintf("%s, %s", files[0].Name, bytesStr(total))
	}
	return fmt.Sprintf("%d files %s..%s, %s", len(files), files[0].Name, files[len(files)-1].Name, bytesStr(total))
}

func (o *observer) event(ev spate.Event) {
	switch e := ev.(type) {
	case spate.Gained:
		d, _ := filesource.DecodeDescriptor(e.Split.Descriptor)
		o.mu.Lock()
		s := o.info(e.Split.ID)
		s.files, s.total, s.rng, s.epoch = d.Files, d.Total(), d.Range, e.Epoch
		s.tail = nil
		if d.Tail != nil {
			s.files = []filesource.Member{{Name: d.Tail.Name, Size: -1}} // followed: no size
			s.tail = e.Split.Descriptor
			s.followed(e.Progress)
		}
		o.gained++
		from := "from the start"
		var resume any
		if e.Progress != nil {
			resume = e.Progress.Watermark
			if e.Progress.Watermark > 0 {
				o.resumed++
				from = fmt.Sprintf("resuming at byte %s of %s", count(e.Progress.Watermark), count(s.total))
				if d.Tail != nil {
					from = fmt.Sprintf("resuming at byte %s", count(e.Progress.Watermark))
				}
			}
		}
		desc := s.describe()
		if o.table {
			desc, from = describeChunk(e.Split), "from the start"
			s.chunk = desc
			if e.Progress != nil && e.Progress.Watermark > 0 {
				from = fmt.Sprintf("resuming at row %s", count(e.Progress.Watermark))
				if e.Split.Weight > 0 {
					from += fmt.Sprintf(" of about %s", count(int64(e.Split.Weight)))
				}
			}
		}
		o.mu.Unlock()
		o.con.event("gained %s (epoch %d) [%s], %s", e.Split.ID, e.Epoch, desc, from)
		o.hist.record("gained", map[string]any{"split": e.Split.ID.String(), "epoch": uint64(e.Epoch), "resume": resume})
	case spate.Lost:
		o.mu.Lock()
		s := o.info(e.Split)
		epoch, revoked := s.epoch, s.revoked
		s.revoked = false
		if !revoked {
			o.lost++
		}
		o.mu.Unlock()
		if revoked {
			// A planned rebalance whose drain did not end in a drained
			// release: the release was forced, not lost.
			o.con.event("rebalance: %s handed to a peer (its drain was cut short); the peer resumes it from its last commit", e.Split)
			o.hist.record("lost", map[string]any{"split": e.Split.String(), "epoch": uint64(epoch), "reason": "revoked"})
			return
		}
		o.con.event("lost %s: its lease ended here (taken over or self-fenced); a peer resumes it", e.Split)
		o.hist.record("lost", map[string]any{"split": e.Split.String(), "epoch": uint64(epoch)})
	case spate.RevokeRequested:
		o.mu.Lock()
		o.info(e.Split).revoked = true
		o.mu.Unlock()
		o.con.event("rebalance: %s is wanted elsewhere; draining it", e.Split)
		o.hist.record("revoke", map[string]any{"split": e.Split.String()})
	case spate.Quarantined:
		o.mu.Lock()
		o.quarantined = append(o.quarantined, e.Split)
		reason := o.info(e.Split).poison
		o.mu.Unlock()
		if reason != "" {
			reason = ": " + reason
		}
		o.con.line("QUARANTINED %s after %d attempts%s", e.Split, e.Attempts, reason)
		o.hist.record("quarantined", map[string]any{"split": e.Split.String(), "attempts": e.Attempts})
	case spate.AllComplete:
		o.mu.Lock()
		first := !o.allComplete
		o.allComplete = true
		o.mu.Unlock()
		if first {
			o.con.event("the job is complete: every split is committed completed")
			o.hist.record("all_complete", nil)
		}
	case spate.Stalled:
		o.mu.Lock()
		first := o.stalled == nil
		o.stalled = &e
		o.mu.Unlock()
		if first {
			o.con.line("the job STALLED: %d splits completed, %d quarantined", e.Completed, e.Quarantined)
			o.hist.record("stalled", map[string]any{"completed": e.Completed, "quarantined": e.Quarantined})
		}
	}
}

func outcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, spate.ErrFenced):
		return "fenced"
	case spate.IsRetryable(err):
		return "retryable"
	}
	return "fatal"
}

// commit records a commit attempt; epoch 0 means the split's latest
// tenancy here (a plain Commit).
func (o *observer) commit(id spate.SplitID, epoch spate.LeaseEpoch, p spate.SplitProgress, err error) {
	o.mu.Lock()
	s := o.info(id)
	if epoch == 0 {
		epoch = s.epoch
	}
	done := err == nil && p.Completed && !s.completed
	if done {
		s.completed = true
		o.completed++
	}
	if err == nil {
		s.followed(&p)
	}
	desc, end := s.describe(), s.end
	o.mu.Unlock()
	fields := map[string]any{"split": id.String(), "epoch": uint64(epoch), "watermark": p.Watermark,
		"completed": p.Completed, "outcome": outcome(err)}
	if err != nil {
		fields["error"] = err.Error()
	}
	o.hist.record("commit", fields)
	switch {
	case done:
		if why := filesource.EndReason(end); why != "" {
			o.con.event("completed %s [%s]: %s", id, desc, why)
		} else {
			o.con.event("completed %s [%s]", id, desc)
		}
	case errors.Is(err, spate.ErrFenced):
		o.con.event("commit of %s fenced: another worker owns it now (nothing was written)", id)
	}
}

func (o *observer) command(ev string, ids []spate.SplitID, reason string, err error) {
	for _, id := range ids {
		o.mu.Lock()
		epoch := o.info(id).epoch
		if (ev == "release" || ev == "release_drained") && err == nil {
			if ev == "release" {
				o.handedBack++
			}
			o.info(id).revoked = false // handed back: nothing is lost after
		}
		if ev == "fail" && reason != "" {
			// The reason a quarantine summary names: a damaged output's
			// reason comes from the coordination driver's Fail, not
			// from a lane.
			o.info(id).poison = reason
		}
		o.mu.Unlock()
		fields := map[string]any{"split": id.String(), "epoch": uint64(epoch), "outcome": outcome(err)}
		if reason != "" {
			fields["reason"] = reason
		}
		if err != nil {
			fields["error"] = err.Error()
		}
		o.hist.record(ev, fields)
		switch ev {
		case "release":
			o.con.event("handed %s back (a peer resumes it from its last commit)", id)
		case "release_drained":
			o.con.event("handed %s back after draining it (rebalance)", id)
		case "fail":
			o.con.event("failed %s: %s", id, reason)
		}
	}
}

func (o *observer) poison(id spate.SplitID, reason string) {
	o.mu.Lock()
	o.info(id).poison = reason
	o.mu.Unlock()
	o.hist.record("poison", map[string]any{"split": id.String(), "reason": reason})
}

func (o *observer) opened(op pipeline.SplitOpening) {
	o.mu.Lock()
	o.parts[op.Partition] = tenancyRef{split: op.Spec.ID, epoch: op.Epoch}
	o.mu.Unlock()
	var resume any
	if op.Progress != nil {
		resume = op.Progress.Watermark
	}
	o.hist.record("open", map[string]any{"split": op.Spec.ID.String(), "epoch": uint64(op.Epoch),
		"partition": uint32(op.Partition), "resume": resume})
}

// durable records a write the sink made durable.
func (o *observer) durable(records []pipeline.Record) {
	var n, b int64
	type span struct {
		n           int
		first, last int64
	}
	var order []pipeline.PartitionID
	spans := map[pipeline.PartitionID]*span{}
	for _, r := range records {
		rows := rowsIn(r)
		n += int64(rows)
		b += int64(len(r.Value)) + 1
		first := r.Offset - int64(rows) + 1
		sp := spans[r.Partition]
		if sp == nil {
			sp = &span{first: first, last: r.Offset}
			spans[r.Partition] = sp
			order = append(order, r.Partition)
		}
		sp.n += rows
		sp.first = min(sp.first, first)
		sp.last = max(sp.last, r.Offset)
	}
	o.records.Add(n)
	o.bytes.Add(b)
	if o.hist == nil {
		return
	}
	for _, p := range order {
		sp := spans[p]
		o.mu.Lock()
		ref := o.parts[p]
		o.mu.Unlock()
		o.hist.record("durable", map[string]any{"split": ref.split.String(), "epoch": uint64(ref.epoch),
			"partition": uint32(p), "records": sp.n, "first": sp.first, "last": sp.last})
	}
}

// describeChunk shows a table's split: its key range, and its rows as
// planned.
func describeChunk(spec spate.SplitSpec) string {
	lo, hi, err := pgsource.KeyRange(spec)
	if err != nil {
		return "a chunk of the table"
	}
	show := func(k *string, none string) string {
		if k == nil {
			return none
		}
		return fitWidth(*k, 40)
	}
	d := fmt.Sprintf("keys (%s, %s]", show(lo, "start"), show(hi, "end"))
	if spec.Weight > 0 {
		d += fmt.Sprintf(", about %s rows", count(int64(spec.Weight)))
	}
	return d
}

// rowsIn is the lines (rows) r carries: one, or a table's packed rows
// (pgsource's PackRows), one a line. A line read from a file holds no
// newline.
func rowsIn(r pipeline.Record) int {
	return bytes.Count(r.Value, []byte{'\n'}) + 1
}

// verdict is the job state this worker saw.
func (o *observer) verdict() (complete bool, stalled *spate.Stalled) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.allComplete, o.stalled
}

// quarantinedSplits lists the quarantines this worker saw, with reasons.
func (o *observer) quarantinedSplits() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for _, id := range o.quarantined {
		s := o.splits[id]
		line := id.String()
		if s != nil && len(s.files) > 0 {
			line += " [" + s.describe() + "]"
		}
		if s != nil && s.poison != "" {
			line += ": " + s.poison
		}
		out = append(out, line)
	}
	sort.Strings(out)
	return out
}

// observedCoord is the StoreCoordinator with every event, commit and
// hand-back seen by the observer.
type observedCoord struct {
	*spate.StoreCoordinator
	obs *observer
}

func (c *observedCoord) Poll() ([]spate.Event, error) {
	evs, err := c.StoreCoordinator.Poll()
	for _, ev := range evs {
		c.obs.event(ev)
	}
	return evs, err
}

func (c *observedCoord) CommitAt(ctx context.Context, split spate.SplitID, epoch spate.LeaseEpoch, p spate.SplitProgress) error {
	err := c.StoreCoordinator.CommitAt(ctx, split, epoch, p)
	c.obs.commit(split, epoch, p, err)
	return err
}

func (c *observedCoord) Fail(ctx context.Context, split spate.SplitID, reason string) error {
	err := c.StoreCoordinator.Fail(ctx, split, reason)
	c.obs.command("fail", []spate.SplitID{split}, reason, err)
	return err
}

func (c *observedCoord) Release(ctx context.Context, splits ...spate.SplitID) error {
	err := c.StoreCoordinator.Release(ctx, splits...)
	c.obs.command("release", splits, "", err)
	return err
}

func (c *observedCoord) ReleaseDrained(ctx context.Context, splits ...spate.SplitID) error {
	err := c.StoreCoordinator.ReleaseDrained(ctx, splits...)
	c.obs.command("release_drained", splits, "", err)
	return err
}

var _ spate.SplitCoordinator = (*observedCoord)(nil)

// observedSplits is the file source with lane openings and poison reports
// seen by the observer.
type observedSplits struct {
	*filesource.Source
	obs *observer
}

func (s *observedSplits) OpenSplit(op pipeline.SplitOpening) (pipeline.Lane, error) {
	return s.Source.OpenSplit(s.obs.opening(op))
}

// opening reports op to the observer and returns it with its poison
// reports seen by the observer too.
func (o *observer) opening(op pipeline.SplitOpening) pipeline.SplitOpening {
	o.opened(op)
	poison := op.Poison
	id := op.Spec.ID
	op.Poison = func(reason string) {
		o.poison(id, reason)
		if poison != nil {
			poison(reason)
		}
	}
	return op
}

// observedTable is observedSplits for a table's source.
type observedTable struct {
	*pgsource.Source
	obs *observer
}

func (s *observedTable) OpenSplit(op pipeline.SplitOpening) (pipeline.Lane, error) {
	return s.Source.OpenSplit(s.obs.opening(op))
}

// outputSink writes through a staging sink and reports every staged
// write to the observer. The staging methods are promoted, so Build wires
// it to the coordinated source.
type outputSink struct {
	stagingSink
	obs *observer
}

// CleanJob implements pipeline.StageCleaner when the staging sink does
// (a table's: its fence rows go once the job completed).
func (s *outputSink) CleanJob(ctx context.Context) error {
	if c, ok := s.stagingSink.(pipeline.StageCleaner); ok {
		return c.CleanJob(ctx)
	}
	return nil
}

func (s *outputSink) Write(ctx context.Context, shard int, records []pipeline.Record) error {
	return s.WriteChunks(ctx, shard, [][]pipeline.Record{records})
}

// WriteChunks must be overridden too: the embedded sink's would be
// promoted, and the runtime prefers it to Write, so writes would go
// unobserved.
func (s *outputSink) WriteChunks(ctx context.Context, shard int, chunks [][]pipeline.Record) error {
	if err := s.stagingSink.WriteChunks(ctx, shard, chunks); err != nil {
		return err
	}
	for _, records := range chunks {
		s.obs.durable(records)
	}
	return nil
}

// pacer admits at most perSecond records per second across every runner
// (--rate). It runs as the first stage of the chain, so a runner that is
// ahead of the rate sleeps before its lanes are polled again: the lanes
// read no faster than the rate and nothing piles up in the sink queues (a
// graceful stop then finds unread input to hand back). Sleeps are short:
// each runner reserves one record at a time.
const paceCredit = 50 * time.Millisecond

type pacer struct {
	mu    sync.Mutex
	every time.Duration
	next  time.Time
}

func newPacer(perSecond float64) *pacer {
	if perSecond <= 0 {
		return nil
	}
	return &pacer{every: time.Duration(float64(time.Second) / perSecond)}
}

// take admits n lines (rows).
func (p *pacer) take(n int) {
	p.mu.Lock()
	now := time.Now()
	// Up to paceCredit of lateness (oversleeping, a slow poll) is made up
	// for; an idle spell beyond it is not saved up as a burst.
	if floor := now.Add(-paceCredit); p.next.Before(floor) {
		p.next = floor
	}
	p.next = p.next.Add(time.Duration(n) * p.every)
	ahead := p.next.Sub(now)
	p.mu.Unlock()
	if ahead > time.Millisecond {
		time.Sleep(ahead) // throttling, not waiting for a condition
	}
}

// stages is the chain: the pacer when a rate is set.
func (p *pacer) stages() []pipeline.Stage {
	if p == nil {
		return nil
	}
	return []pipeline.Stage{pipeline.Map("pace", pipeline.Fail, func(r pipeline.Record) (pipeline.Record, error) {
		p.take(rowsIn(r))
		return r, nil
	})}
}
