package jobview

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/jobfollow"
)

// A hub is the one reader of one job that every open page of it shares.
// It watches the job's two keyspaces once, folds each record into a
// follower (internal/jobfollow) and, at most once per refresh, turns the
// splits that changed into rows: the summary and members are kept by
// adding and taking away the changed rows' shares, so a refresh costs what
// changed, not the job's size or the number of pages. Subscribers get only
// the changed rows.
type hub struct {
	job     string
	st      spate.Store
	log     *slog.Logger
	refresh time.Duration
	now     func() time.Time
	lagOf   func() map[string]Lag // nil: what the commits recorded only
	lags    map[string]Lag        // the last lagOf, read at each refresh

	mu           sync.Mutex
	meta         *spate.JobState // plan, leader, members, assignments
	rows         map[string]row
	leased       map[string]bool // the ids of the leased rows
	sum          summary         // counts and sums; state and ETA derived
	members      []member
	summaryShown summary // the last summary sent
	sorted       []row   // rows by id, for pages; nil when stale
	rev          uint64  // the store revision the rows include
	err          error   // why the job cannot be shown, or nil
	subs         map[chan event]struct{}
	history      []sample // done vs total, and each member's rate, over time
	chart        chart    // the history drawn, at chartAt
	chartAt      time.Time
	timeline     []entry            // gains, losses, takeovers, quarantines; newest last
	splitHist    map[string][]entry // each split's own timeline, for its page
	recent       []change           // the last updates' changed ids, for resuming pages
	rates        map[string]rate
	beats        map[string]beat // each member's last heartbeat seen
	ready        chan struct{}   // closed after the first read

	cancel context.CancelFunc
	done   chan struct{}
}

// change is one sent update: its revision and the splits it changed.
type change struct {
	rev uint64
	ids []string
}

// sample is one point of the charts: bytes done and total, and each
// member's committed rate.
type sample struct {
	At          time.Time
	Done, Total int64
	Rates       map[string]int64
}

// sameValues reports whether s and o chart the same values.
func (s sample) sameValues(o sample) bool {
	return s.Done == o.Done && s.Total == o.Total && maps.Equal(s.Rates, o.Rates)
}

// entry is one line of the job's timeline.
type entry struct {
	At    time.Time `json:"at"`
	Kind  string    `json:"kind"` // gained, released (handed back), lost (its lease ended), takeover, completed, quarantined, requeued
	Split string    `json:"split"`
	Owner string    `json:"owner"`
	From  string    `json:"from,omitempty"`
}

// beat is when the view last saw a member's presence record written.
// A record read in a snapshot says only that the member was present
// then (seen is false): the record holds no time, and the view knows of
// no beat before it opened.
type beat struct {
	at   time.Time
	seen bool // at is a live write the watch delivered
}

// rate is a split's committed-bytes rate, from its last two watermarks.
type rate struct {
	at     time.Time // the reference point
	wm     int64
	bps    float64
	prevAt time.Time // the last reading, the next reference
	prevWm int64
}

const (
	maxHistory      = 600 // chart points kept
	maxTimeline     = 500 // timeline entries kept
	maxSplitHistory = 50  // entries kept of each split's own timeline
)

// newHub starts following job on st.
func newHub(job string, st spate.Store, log *slog.Logger, refresh time.Duration, lag func() map[string]Lag) *hub {
	ctx, cancel := context.WithCancel(context.Background())
	h := emptyHub(job, log)
	h.st, h.refresh, h.cancel, h.lagOf = st, refresh, cancel, lag
	go h.run(ctx)
	return h
}

// emptyHub is a hub that has read nothing and follows nothing yet.
func emptyHub(job string, log *slog.Logger) *hub {
	return &hub{job: job, log: log, now: time.Now,
		rows: map[string]row{}, leased: map[string]bool{}, splitHist: map[string][]entry{},
		subs: map[chan event]struct{}{}, rates: map[string]rate{}, beats: map[string]beat{},
		ready: make(chan struct{}), done: make(chan struct{})}
}

func (h *hub) close() {
	h.cancel()
	<-h.done
	_ = h.st.Close()
}

const (
	maxRecent    = 256  // updates remembered for a page that resumes
	maxResetRows = 2000 // beyond this a stale page reloads instead of taking every row
)

// watched is one event of one keyspace's watch.
type watched struct {
	ks spate.Keyspace
	ev spate.WatchEvent
}

// run follows the job: both keyspaces' watches feed one follower; once
// both snapshots are in, the view is built whole, then kept by the
// changes. A broken watch starts both again from fresh snapshots.
func (h *hub) run(ctx context.Context) {
	defer close(h.done)
	tick := time.NewTicker(h.refresh)
	defer tick.Stop()
	readyOnce := sync.OnceFunc(func() { close(h.ready) })
	defer readyOnce()
	for ctx.Err() == nil {
		h.follow(ctx, tick.C, readyOnce)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// hubKeyspaces are the job's two watches, by index.
var hubKeyspaces = [2]spate.Keyspace{spate.Durable, spate.Ephemeral}

// follow reads the job from both watches' snapshots on until ctx ends or
// a watch breaks. Both watches are read here, not forwarded: a large
// job's snapshot is one hop per record, not two.
func (h *hub) follow(ctx context.Context, tick <-chan time.Time, readyOnce func()) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var chs [2]<-chan spate.WatchEvent
	for i, ks := range hubKeyspaces {
		chs[i] = h.watch(wctx, ks)
	}
	r := &reading{h: h, f: jobfollow.New(""), live: map[spate.Keyspace]bool{}, dirty: map[string]bool{}, readyOnce: readyOnce}
	r.f.Defer() // the snapshots are read on every core at once
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-chs[0]:
			if !r.apply(received(0, ev, ok)) {
				return
			}
		case ev, ok := <-chs[1]:
			if !r.apply(received(1, ev, ok)) {
				return
			}
		case <-tick:
			r.refresh()
		}
	}
}

// received is watch i's event; a closed watch is a broken one.
func received(i int, ev spate.WatchEvent, ok bool) watched {
	if !ok {
		ev = spate.WatchEvent{Kind: spate.WatchError, Err: errors.New("the watch ended")}
	}
	return watched{hubKeyspaces[i], ev}
}

// reading is one follow's state: the job as its watches have delivered it,
// and what changed since the pages were last updated.
type reading struct {
	h         *hub
	f         jobfollow.Follower
	live      map[spate.Keyspace]bool // its snapshot is in
	snapshots int
	dirty     map[string]bool // splits changed since the last update
	metaDirty bool            // the plan, leader, members or assignments changed
	idle      int             // refreshes since the leased rows were last redone
	rev       uint64
	readyOnce func()
}

// apply folds one event; false: the watches must start again.
func (r *reading) apply(w watched) bool {
	h := r.h
	switch w.ev.Kind {
	case spate.WatchError:
		h.log.Warn("job view: the job's watch broke; reading it again", "job", h.job, "error", w.ev.Err)
		if r.snapshots < 2 {
			// Nothing read yet: a page says why, rather than wait.
			h.mu.Lock()
			h.err = fmt.Errorf("cannot watch the job: %w", w.ev.Err)
			h.mu.Unlock()
			r.readyOnce()
		}
		return false
	case spate.WatchSnapshotDone:
		r.live[w.ks] = true
		if r.snapshots++; r.snapshots == 2 {
			if err := r.f.Decode(); err != nil {
				h.log.Debug("job view: a record cannot be read", "job", h.job, "error", err)
			}
			h.rebuild(r.f, r.rev)
			r.readyOnce()
			clear(r.dirty)
			r.metaDirty = false
		}
		return true
	}
	r.rev = max(r.rev, w.ev.Revision)
	touched, err := r.f.Apply(w.ks, w.ev)
	if err != nil && !errors.Is(err, spate.ErrNoJob) {
		h.log.Debug("job view: a record cannot be read", "job", h.job, "key", w.ev.Key, "error", err)
	}
	if touched.Split != "" {
		r.dirty[touched.Split] = true
	}
	r.metaDirty = r.metaDirty || touched.Job
	if touched.Member != "" {
		h.beat(touched.Member, w.ev.Kind == spate.WatchPut, r.live[w.ks])
	}
	return true
}

// refresh updates the pages with what changed since the last refresh.
// Rates and ETAs move without a write: every few refreshes the leased
// rows (a fleet's lanes, not the job) are redone, and so are the members'
// heartbeat ages.
func (r *reading) refresh() {
	if r.snapshots < 2 {
		return
	}
	h := r.h
	if r.idle++; r.idle >= 8 {
		r.idle = 0
		var lags map[string]Lag
		if h.lagOf != nil {
			lags = h.lagOf()
		}
		h.mu.Lock()
		for id := range h.leased {
			r.dirty[id] = true
		}
		if h.lagOf != nil {
			for id := range h.lags {
				r.dirty[id] = true // caught up or gone since
			}
			for id := range lags {
				r.dirty[id] = true
			}
			h.lags = lags
		}
		r.metaDirty = r.metaDirty || len(h.beats) > 0
		h.mu.Unlock()
	}
	if len(r.dirty) > 0 || r.metaDirty {
		h.update(r.f, r.dirty, r.rev, r.metaDirty)
		clear(r.dirty)
		r.metaDirty = false
	}
}

// watch opens a watch of one keyspace of the job; a watch that cannot
// open is one whose first event is its error.
func (h *hub) watch(ctx context.Context, ks spate.Keyspace) <-chan spate.WatchEvent {
	ch, err := h.st.Watch(ctx, ks, "")
	if err != nil {
		failed := make(chan spate.WatchEvent, 1)
		failed <- spate.WatchEvent{Kind: spate.WatchError, Err: err}
		return failed
	}
	return ch
}

// beat records that inst's presence record was written (put) or
// deleted; live says the write is one the watch saw happen, not one read
// in a snapshot. A snapshot read again after a broken watch keeps the
// beat already seen.
func (h *hub) beat(inst string, put, live bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, had := h.beats[inst]
	switch {
	case !put:
		delete(h.beats, inst)
	case live:
		h.beats[inst] = beat{at: h.now(), seen: true}
	case !had:
		h.beats[inst] = beat{at: h.now()}
	}
}

// rebuild makes the view whole from f: the first paint, and after a
// broken watch. Subscribers get every row again.
func (h *hub) rebuild(f jobfollow.Follower, rev uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rebuildLocked(f, rev, h.now())
}

// rebuildLocked is rebuild with h.mu held.
func (h *hub) rebuildLocked(f jobfollow.Follower, rev uint64, now time.Time) {
	js, err := f.State()
	h.err = err
	if err != nil {
		if !errors.Is(err, spate.ErrNoJob) {
			h.log.Warn("job view: cannot read the job", "job", h.job, "error", err)
		}
		return
	}
	prev := h.rows
	h.meta = js
	h.rows = make(map[string]row, len(js.Splits))
	h.leased = map[string]bool{}
	h.sum = summary{}
	changed := make([]row, 0, len(js.Splits))
	var timeline []entry
	if len(h.rates) == 0 {
		h.rates = make(map[string]rate, len(js.Splits))
	}
	for _, sp := range js.Splits {
		rev = max(rev, sp.Revision)
		r := h.rowOf(sp, now)
		h.add(r)
		if old, ok := prev[r.ID]; ok {
			timeline = append(timeline, transitions(old, r, now)...)
		}
		changed = append(changed, r)
	}
	for id := range h.rates {
		if _, ok := h.rows[id]; !ok {
			delete(h.rates, id)
		}
	}
	h.sorted = changed // js.Splits are sorted by id
	h.rev = max(rev, h.rev)
	// A page behind this revision cannot be told what changed; one at it
	// or later can.
	h.recent = []change{{rev: h.rev}}
	h.publish(now, update{Reset: true, Splits: changed, Timeline: timeline}, nil)
}

// update turns the dirty splits into rows, keeps the summary by their
// shares, and sends the rows that changed.
func (h *hub) update(f jobfollow.Follower, dirty map[string]bool, rev uint64, metaDirty bool) {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if metaDirty || h.meta == nil {
		meta, err := f.Meta()
		h.err = err
		if err != nil {
			return
		}
		if h.meta == nil || h.meta.Plan.Fingerprint != meta.Plan.Fingerprint {
			// A plan appeared, or changed whole: read every split.
			h.rebuildLocked(f, rev, now)
			return
		}
		h.meta = meta
	}
	var msg update
	var ids []string
	for id := range dirty {
		old, had := h.rows[id]
		sp, ok := f.Split(id)
		switch {
		case !ok && !had:
			continue
		case !ok:
			h.remove(old)
			delete(h.rates, id)
			msg.Removed = append(msg.Removed, id)
		default:
			rev = max(rev, sp.Revision)
			r := h.rowOf(sp, now)
			if had && r == old {
				continue
			}
			if had {
				h.remove(old)
				msg.Timeline = append(msg.Timeline, transitions(old, r, now)...)
			}
			h.add(r)
			msg.Splits = append(msg.Splits, r)
		}
		ids = append(ids, id)
	}
	h.rev = max(rev, h.rev)
	if len(ids) > 0 {
		h.sorted = nil
	}
	slices.SortFunc(msg.Splits, func(a, b row) int { return strings.Compare(a.ID, b.ID) })
	h.publish(now, msg, ids)
}

// rowOf is sp's row, with its file's lag as this process measures it
// when it does. h.mu is held.
func (h *hub) rowOf(sp spate.SplitState, now time.Time) row {
	r := rowOf(sp, now, h.rates)
	if l, ok := h.lags[r.ID]; ok && r.File != "" && r.State != string(spate.StatusCompleted) {
		r.Left, r.Behind = l.Bytes, 0
		if !l.Since.IsZero() && l.Bytes > 0 {
			r.Behind = l.Since.UnixMilli()
		}
		w := max(r.Watermark+l.Bytes, 1)
		r.Weight, r.done, r.Percent = uint64(w), min(r.Watermark, w), int(100*r.Watermark/w)
		if r.Rate > 0 && l.Bytes > 0 {
			r.ETA = age(time.Duration(float64(l.Bytes) / float64(r.Rate) * float64(time.Second)))
		} else {
			r.ETA = ""
		}
	}
	return r
}

func (h *hub) add(r row) {
	h.rows[r.ID] = r
	h.sum.count(r, 1)
	if r.State == "leased" || r.State == "parked" {
		h.leased[r.ID] = true
	}
}

func (h *hub) remove(r row) {
	delete(h.rows, r.ID)
	delete(h.leased, r.ID)
	h.sum.count(r, -1)
}

// publish completes msg with the summary, members and chart, records it
// and sends it to the subscribers when a page would show a change.
// h.mu is held.
func (h *hub) publish(now time.Time, msg update, ids []string) {
	leader := ""
	if h.meta.Leader != nil {
		leader = h.meta.Leader.Instance
	}
	members := membersOf(h.meta, leader, h.beats, now, func(yield func(row) bool) {
		for id := range h.leased {
			if !yield(h.rows[id]) {
				return
			}
		}
	})
	sum := h.sum.finished(h.meta.Plan.Finality == spate.PlanFinal)
	h.timeline = append(h.timeline, msg.Timeline...)
	if n := len(h.timeline) - maxTimeline; n > 0 {
		h.timeline = slices.Delete(h.timeline, 0, n)
	}
	for _, e := range msg.Timeline {
		hs := append(h.splitHist[e.Split], e)
		if n := len(hs) - maxSplitHistory; n > 0 {
			hs = slices.Delete(hs, 0, n)
		}
		h.splitHist[e.Split] = hs
	}
	for _, id := range msg.Removed {
		delete(h.splitHist, id)
	}
	s := sample{At: now, Done: sum.BytesDone, Total: sum.BytesTotal, Rates: make(map[string]int64, len(members))}
	for _, m := range members {
		s.Rates[m.Instance] = m.Rate
	}
	// One point per second at most: the chart spans maxHistory seconds
	// and the newest point follows the job in between.
	switch last := len(h.history) - 1; {
	case last >= 0 && now.Sub(h.history[last].At) < time.Second:
		s.At = h.history[last].At
		h.history[last] = s
	case last < 0 || !s.sameValues(h.history[last]):
		h.history = append(h.history, s)
		if n := len(h.history) - maxHistory; n > 0 {
			h.history = slices.Delete(h.history, 0, n)
		}
	}
	// The chart's points move with its span: redrawn at most once a
	// second (600 points), not at every update.
	if msg.Reset || h.chartAt.IsZero() || now.Sub(h.chartAt) >= time.Second {
		h.chart, h.chartAt = chartOf(h.history), now
	}
	if !msg.Reset && len(msg.Splits) == 0 && len(msg.Removed) == 0 && sum == h.summaryShown && slices.Equal(members, h.members) {
		return // nothing a page shows changed
	}
	h.summaryShown, h.members = sum, members
	if msg.Reset && len(msg.Splits) > maxResetRows {
		msg.Splits, msg.Reload = nil, true
	}
	msg.Rev = strconv.FormatUint(h.rev, 10)
	msg.Summary, msg.Members, msg.Chart, msg.Leader = sum, members, h.chart, leader
	if len(ids) > 0 {
		h.recent = append(h.recent, change{rev: h.rev, ids: ids})
		if n := len(h.recent) - maxRecent; n > 0 {
			h.recent = slices.Delete(h.recent, 0, n)
		}
	}
	ev := msg.event()
	for sub := range h.subs {
		select {
		case sub <- ev:
		default:
			// A page too slow to take its updates is dropped; its browser
			// reconnects and resumes, or gets the whole view again.
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
	case old.Lease != "" && r.Lease == "" && r.State != "completed" && r.Owner == "":
		// Handed back (a rebalance's drained release, or a graceful
		// stop): the durable owner is cleared. Not a loss.
		out = append(out, entry{At: now, Kind: "released", Split: r.ID, Owner: old.Lease})
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
// follows; one a few updates behind gets the rows changed since; any
// other the whole view first (or, for a large job, word to reload).
func (h *hub) subscribe(since string) (chan event, *event) {
	<-h.ready
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := make(chan event, 64)
	h.subs[ch] = struct{}{}
	cur := strconv.FormatUint(h.rev, 10)
	if h.meta == nil || since == cur {
		return ch, nil
	}
	msg := update{Rev: cur, Summary: h.summaryShown, Members: h.members, Chart: h.chart}
	if h.meta.Leader != nil {
		msg.Leader = h.meta.Leader.Instance
	}
	if at, err := strconv.ParseUint(since, 10, 64); err == nil && at < h.rev && len(h.recent) > 0 && h.recent[0].rev <= at {
		// Resume: the rows changed after at, as they are now.
		ids := map[string]bool{}
		for _, c := range h.recent {
			if c.rev > at {
				for _, id := range c.ids {
					ids[id] = true
				}
			}
		}
		// More changed than a reset may send: the reset below instead
		// (every row, or word to reload for a job over the row limit).
		if len(ids) <= maxResetRows {
			for _, id := range slices.Sorted(maps.Keys(ids)) {
				if r, ok := h.rows[id]; ok {
					msg.Splits = append(msg.Splits, r)
				} else {
					msg.Removed = append(msg.Removed, id)
				}
			}
			ev := msg.event()
			return ch, &ev
		}
	}
	msg.Reset, msg.Timeline = true, h.timeline
	if len(h.rows) > maxResetRows {
		msg.Reload = true
	} else {
		msg.Splits = h.sortedRows()
	}
	ev := msg.event()
	return ch, &ev
}

// sortedRows is every row by id; h.mu is held.
func (h *hub) sortedRows() []row {
	if h.sorted == nil {
		h.sorted = slices.SortedFunc(maps.Values(h.rows), func(a, b row) int { return strings.Compare(a.ID, b.ID) })
	}
	return h.sorted
}

func (h *hub) unsubscribe(ch chan event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[ch]; ok {
		delete(h.subs, ch)
		close(ch)
	}
}

// snapshot is what a page is rendered from (nil before the job has a
// plan).
func (h *hub) snapshot() (*view, string, chart, []entry, error) {
	<-h.ready
	h.mu.Lock()
	defer h.mu.Unlock()
	var v *view
	if h.meta != nil {
		m := h.meta.Plan
		v = &view{Job: h.job, Summary: h.summaryShown, Members: h.members, Splits: h.sortedRows(),
			Plan: plan{Generation: m.Generation, Final: m.Finality == spate.PlanFinal, Planned: m.Planned, Fingerprint: m.Fingerprint}}
		if h.meta.Leader != nil {
			v.Leader = h.meta.Leader.Instance
		}
	}
	return v, strconv.FormatUint(h.rev, 10), h.chart, slices.Clone(h.timeline), h.err
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
	Reset    bool     `json:"reset,omitempty"`  // Splits is every row: drop the others
	Reload   bool     `json:"reload,omitempty"` // too many rows to send: reload the page
	Summary  summary  `json:"summary"`
	Members  []member `json:"members"`
	Leader   string   `json:"leader"`
	Splits   []row    `json:"splits,omitempty"`
	Removed  []string `json:"removed,omitempty"`
	Timeline []entry  `json:"timeline,omitempty"`
	Chart    chart    `json:"chart"`
}

// splitPage is one split's row and its own timeline, newest first; ok is
// false for a split the job does not hold.
func (h *hub) splitPage(id string) (r row, hist []entry, rev string, ok bool) {
	<-h.ready
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok = h.rows[id]
	hs := h.splitHist[id]
	for i := len(hs) - 1; i >= 0; i-- {
		hist = append(hist, hs[i])
	}
	return r, hist, strconv.FormatUint(h.rev, 10), ok
}
