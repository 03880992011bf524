package jobview

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spate-go/spate"
)

// A hub is the one reader of one job that every open page of it shares:
// one watch per keyspace of the job's store, one read of the job per
// refresh, whatever the number of pages. It folds each read into the
// job's view, diffs it against the last and sends subscribers only the
// rows that changed.
type hub struct {
	job     string
	st      spate.Store
	log     *slog.Logger
	refresh time.Duration
	now     func() time.Time

	mu       sync.Mutex
	cur      *view
	rev      uint64 // the store revision the current view includes
	err      error  // the last read's error, shown on the page
	subs     map[chan event]struct{}
	history  []sample // done vs total over time, for the chart
	timeline []entry  // gains, losses, takeovers, quarantines; newest last
	rates    map[string]rate
	ready    chan struct{} // closed after the first read

	cancel context.CancelFunc
	done   chan struct{}
}

// sample is one point of the progress chart.
type sample struct {
	At          time.Time
	Done, Total int64
}

// entry is one line of the job's timeline.
type entry struct {
	At    time.Time `json:"at"`
	Kind  string    `json:"kind"` // gained, lost, takeover, completed, quarantined, requeued
	Split string    `json:"split"`
	Owner string    `json:"owner"`
	From  string    `json:"from,omitempty"`
}

// rate is a split's committed-bytes rate, from its last two watermarks.
type rate struct {
	at  time.Time
	wm  int64
	bps float64
}

const (
	maxHistory  = 600 // chart points kept
	maxTimeline = 500 // timeline entries kept
)

func newHub(job string, st spate.Store, log *slog.Logger, refresh time.Duration) *hub {
	ctx, cancel := context.WithCancel(context.Background())
	h := &hub{job: job, st: st, log: log, refresh: refresh, now: time.Now,
		subs: map[chan event]struct{}{}, rates: map[string]rate{},
		ready: make(chan struct{}), cancel: cancel, done: make(chan struct{})}
	go h.run(ctx)
	return h
}

func (h *hub) close() {
	h.cancel()
	<-h.done
	_ = h.st.Close()
}

// run watches the job and re-reads it, at most once per refresh, after
// anything changed; every few refreshes it re-reads anyway (ages and
// rates move without a write).
func (h *hub) run(ctx context.Context) {
	defer close(h.done)
	var seen atomic.Uint64 // the highest revision the watches delivered
	changed := make(chan struct{}, 1)
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		go h.watch(ctx, ks, &seen, changed)
	}
	h.read(ctx, 0)
	close(h.ready)
	tick := time.NewTicker(h.refresh)
	defer tick.Stop()
	var (
		dirty bool
		idle  int
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
			dirty = true
		case <-tick.C:
			idle++
			if dirty || idle >= 8 {
				dirty, idle = false, 0
				h.read(ctx, seen.Load())
			}
		}
	}
}

// watch follows one keyspace of the job: it raises seen to the revisions
// it sees and signals changed. A broken watch is opened again after a
// pause.
func (h *hub) watch(ctx context.Context, ks spate.Keyspace, seen *atomic.Uint64, changed chan<- struct{}) {
	for ctx.Err() == nil {
		ch, err := h.st.Watch(ctx, ks, "")
		if err != nil {
			h.log.Warn("job view: cannot watch the job; retrying", "job", h.job, "error", err)
		} else {
			for ev := range ch {
				if ev.Kind == spate.WatchError {
					h.log.Warn("job view: the job's watch broke; reopening it", "job", h.job, "error", ev.Err)
					break
				}
				if ev.Kind == spate.WatchSnapshotDone {
					continue
				}
				raise(seen, ev.Revision)
				select {
				case changed <- struct{}{}:
				default: // a change is already signalled
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// raise sets v to rev if rev is higher.
func raise(v *atomic.Uint64, rev uint64) {
	for cur := v.Load(); rev > cur; cur = v.Load() {
		if v.CompareAndSwap(cur, rev) {
			return
		}
	}
}

// read reads the job, folds it into the view and broadcasts the change.
func (h *hub) read(ctx context.Context, rev uint64) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	js, err := spate.InspectJob(rctx, h.st, "")
	cancel()
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		if !errors.Is(err, spate.ErrNoJob) {
			h.log.Warn("job view: cannot read the job", "job", h.job, "error", err)
		}
		h.err = err
		return
	}
	h.err = nil
	for _, sp := range js.Splits {
		rev = max(rev, sp.Revision)
	}
	next := buildView(h.job, js, now, h.rates)
	prev := h.cur
	msg := update{Rev: strconv.FormatUint(max(rev, h.rev), 10), Summary: next.Summary, Members: next.Members}
	if prev == nil {
		msg.Reset = true
	}
	if prev != nil {
		for _, r := range next.Splits {
			old, ok := prev.byID[r.ID]
			if !ok || old != r {
				msg.Splits = append(msg.Splits, r)
			}
			if ok {
				msg.Timeline = append(msg.Timeline, transitions(old, r, now)...)
			}
		}
		for id := range prev.byID {
			if _, ok := next.byID[id]; !ok {
				msg.Removed = append(msg.Removed, id)
			}
		}
	}
	h.timeline = append(h.timeline, msg.Timeline...)
	if n := len(h.timeline) - maxTimeline; n > 0 {
		h.timeline = slices.Delete(h.timeline, 0, n)
	}
	s := sample{At: now, Done: next.Summary.BytesDone, Total: next.Summary.BytesTotal}
	if len(h.history) == 0 || h.history[len(h.history)-1] != s {
		h.history = append(h.history, s)
		if n := len(h.history) - maxHistory; n > 0 {
			h.history = slices.Delete(h.history, 0, n)
		}
	}
	msg.Chart = chartOf(h.history)
	h.cur = next
	h.rev = max(rev, h.rev)
	if prev != nil && len(msg.Splits) == 0 && len(msg.Removed) == 0 && prev.Summary == next.Summary && slices.Equal(prev.Members, next.Members) {
		return // nothing a page shows changed
	}
	ev := msg.event()
	for sub := range h.subs {
		select {
		case sub <- ev:
		default:
			// A page too slow to take its updates is dropped; its browser
			// reconnects and gets the whole view again.
			close(sub)
			delete(h.subs, sub)
		}
	}
}

// transitions are the timeline entries between a split's two rows.
func transitions(old, r row, now time.Time) []entry {
	var out []entry
	switch {
	case old.Lease != r.Lease && r.Lease != "" && old.Lease != "":
		out = append(out, entry{At: now, Kind: "takeover", Split: r.ID, Owner: r.Lease, From: old.Lease})
	case old.Lease != r.Lease && r.Lease != "" && r.Epoch > old.Epoch && old.Owner != "" && old.Owner != r.Lease:
		out = append(out, entry{At: now, Kind: "takeover", Split: r.ID, Owner: r.Lease, From: old.Owner})
	case old.Lease != r.Lease && r.Lease != "":
		out = append(out, entry{At: now, Kind: "gained", Split: r.ID, Owner: r.Lease})
	case old.Lease != "" && r.Lease == "" && r.State != "completed":
		out = append(out, entry{At: now, Kind: "lost", Split: r.ID, Owner: old.Lease})
	}
	if old.State != r.State {
		switch r.State {
		case "completed", "quarantined":
			out = append(out, entry{At: now, Kind: r.State, Split: r.ID, Owner: r.Owner})
		case "runnable", "leased":
			if old.State == "quarantined" {
				out = append(out, entry{At: now, Kind: "requeued", Split: r.ID})
			}
		}
	}
	return out
}

// subscribe registers a page. since is the revision the page already
// shows ("" for none): a page at the current revision gets only what
// follows, any other the whole view first.
func (h *hub) subscribe(since string) (chan event, *event) {
	<-h.ready
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := make(chan event, 64)
	h.subs[ch] = struct{}{}
	cur := strconv.FormatUint(h.rev, 10)
	if h.cur == nil || since == cur {
		return ch, nil
	}
	msg := update{Rev: cur, Reset: true, Summary: h.cur.Summary, Members: h.cur.Members,
		Splits: h.cur.Splits, Chart: chartOf(h.history), Timeline: h.timeline}
	ev := msg.event()
	return ch, &ev
}

func (h *hub) unsubscribe(ch chan event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[ch]; ok {
		delete(h.subs, ch)
		close(ch)
	}
}

// snapshot is what a page is rendered from.
func (h *hub) snapshot() (*view, string, []sample, []entry, error) {
	<-h.ready
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur, strconv.FormatUint(h.rev, 10), slices.Clone(h.history), slices.Clone(h.timeline), h.err
}

// event is one server-sent event: its id (a store revision) and data.
type event struct {
	id   string
	data []byte
}

func (u update) event() event {
	b, _ := json.Marshal(u)
	return event{id: u.Rev, data: b}
}

// update is one server-sent event's data: the rows that changed since
// the last.
type update struct {
	Rev      string   `json:"rev"`
	Reset    bool     `json:"reset,omitempty"` // Splits is every row: drop the others
	Summary  summary  `json:"summary"`
	Members  []member `json:"members"`
	Splits   []row    `json:"splits,omitempty"`
	Removed  []string `json:"removed,omitempty"`
	Timeline []entry  `json:"timeline,omitempty"`
	Chart    chart    `json:"chart"`
}
