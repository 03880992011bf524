package jobview

import (
	"cmp"
	"encoding/json"
	"iter"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/humanize"
	"github.com/spate-go/spate/pipeline/filesource"
)

// view is one read of a job, as the page shows it.
type view struct {
	Job     string
	Plan    plan
	Leader  string
	Summary summary
	Members []member
	Splits  []row // sorted by id
}

type plan struct {
	Generation  uint64
	Final       bool
	Planned     uint64
	Fingerprint string
}

type summary struct {
	State       string  `json:"state"` // running, complete, stalled, following (an open plan)
	Splits      int     `json:"splits"`
	Completed   int     `json:"completed"`
	Leased      int     `json:"leased"`
	Parked      int     `json:"parked"` // leased splits of idle followed files: they take no lane
	Runnable    int     `json:"runnable"`
	Quarantined int     `json:"quarantined"`
	Damaged     int     `json:"damaged"`
	Pending     int     `json:"pending"` // splits whose listed output awaits a new owner's publish
	BytesTotal  int64   `json:"bytes_total"`
	BytesDone   int64   `json:"bytes_done"`
	Rate        float64 `json:"rate"` // committed bytes per second, over the live splits
	ETA         string  `json:"eta"`
}

type member struct {
	Instance string `json:"instance"`
	Leader   bool   `json:"leader"`
	Lanes    int    `json:"lanes"`
	Held     int    `json:"held"`     // splits it holds a live lease on
	Assigned int    `json:"assigned"` // splits the leader assigned it
	Left     int64  `json:"left"`     // bytes left on what it holds
	Rate     int64  `json:"rate"`     // bytes per second over what it holds
	// Beat is the age of its last heartbeat the view saw: "2s"; or, for
	// a member seen only in the view's first read, ">12s" (no beat seen
	// since the view opened 12 s ago); "" when unknown.
	Beat string `json:"beat"`
}

// row is one split's line. Its fields are comparable: a changed row is
// one that differs.
type row struct {
	ID        string `json:"id"`
	State     string `json:"state"` // leased, parked (a leased idle followed file), runnable, completed, quarantined, damaged
	Owner     string `json:"owner"`
	Lease     string `json:"lease"`
	Epoch     uint64 `json:"epoch"`
	Attempts  uint32 `json:"attempts"`
	Watermark int64  `json:"watermark"`
	Weight    uint64 `json:"weight"`
	Left      int64  `json:"left"` // -1: unknown
	Percent   int    `json:"percent"`
	Rate      int64  `json:"rate"` // bytes per second
	ETA       string `json:"eta"`
	// Written is when its record was last written, in Unix milliseconds
	// (0: unknown); the page shows its age. An age in the row itself
	// would change every read and send every row each time.
	Written int64  `json:"written"`
	Damage  string `json:"damage,omitempty"`
	// Reason is why its last attempt was charged (a quarantined split's
	// is why it was set aside).
	Reason string `json:"reason,omitempty"`
	// Pending: the split's record lists staged output its owner may not
	// have published: the owner died (its lease is gone, its ownership
	// was not handed back) after the commit that lists it. Whoever takes
	// the split over publishes it first; until then the output is
	// committed but not visible.
	Pending bool `json:"pending,omitempty"`
	// File, for a split that follows a file, is the file's path as its
	// last commit saw it; Found the name it was found under, when it was
	// renamed since; End why it completed. Output is the output file its
	// last commit lists.
	File   string `json:"file,omitempty"`
	Found  string `json:"found,omitempty"`
	End    string `json:"end,omitempty"`
	Output string `json:"output,omitempty"`
	// Behind, for a followed file with bytes left at its last commit, is
	// when that commit was written (Unix ms): its oldest unread byte is
	// at least that old.
	Behind int64 `json:"behind,omitempty"`
	done   int64 // its share of the summary's bytes done
}

// rowOf is a split's row. rates carries each split's last watermark and
// rate from one read of it to the next.
func rowOf(sp spate.SplitState, now time.Time, rates map[string]rate) row {
	id := sp.ID.String()
	r := row{ID: id, State: string(sp.Status), Owner: sp.Owner, Lease: sp.LeaseOwner, Epoch: uint64(sp.Epoch),
		Attempts: sp.Attempts, Weight: sp.Weight, Left: -1, Reason: sp.LastFailure}
	if sp.Progress != nil {
		r.Watermark = sp.Progress.Watermark
	}
	switch {
	case sp.Damage != nil:
		r.State, r.Damage = string(spate.StatusDamaged), sp.Damage.Error()
	case sp.Status == spate.StatusCompleted, sp.Status == spate.StatusQuarantined:
	case sp.LeaseOwner != "" && sp.Progress != nil && sp.Progress.Parked:
		r.State = "parked" // held, but an idle followed file takes no lane
	case sp.LeaseOwner != "":
		r.State = "leased"
	}
	w := int64(max(sp.Weight, 1))
	lag, followed := int64(0), false
	if sp.Progress != nil {
		lag, followed = filesource.TailLag(*sp.Progress)
		r.Output = outputFile(sp.Progress.Output)
	}
	if f, ok := filesource.FollowedOf(sp.Descriptor, sp.Progress); ok {
		r.File = f.Name
		if f.Found != f.Name {
			r.Found = f.Found
		}
		if sp.Status == spate.StatusCompleted {
			r.End = filesource.EndReason(f.End)
		}
		if sp.Progress == nil && sp.Status != spate.StatusCompleted {
			// Never committed: how much it holds is known only by looking
			// at the file.
			r.Weight, r.Left = 0, -1
		}
	}
	switch {
	case followed:
		// A followed file (spate backfill --follow): its size is what its
		// last commit saw, and what is left is its lag then.
		w = max(r.Watermark+lag, 1)
		r.Weight, r.done = uint64(w), min(r.Watermark, w)
		r.Left, r.Percent = lag, 100
		if sp.Status != spate.StatusCompleted && lag > 0 {
			r.Percent = int(100 * r.Watermark / w)
		}
		if sp.Status == spate.StatusCompleted {
			r.Left = 0
		} else if lag > 0 && !sp.WrittenAt.IsZero() {
			r.Behind = sp.WrittenAt.UnixMilli()
		}
	case r.File != "" && r.Left < 0:
	case sp.Status == spate.StatusCompleted:
		r.Left, r.Percent = 0, 100
		r.done = w
	case sp.HasSpec || sp.Weight > 0:
		r.Left = max(int64(sp.Weight)-r.Watermark, 0)
		r.done = min(r.Watermark, w)
		if sp.Weight > 0 {
			r.Percent = int(min(100, 100*r.Watermark/int64(sp.Weight)))
		}
	}
	if !sp.WrittenAt.IsZero() {
		r.Written = sp.WrittenAt.UnixMilli()
	}
	r.Pending = sp.Status == spate.StatusRunnable && sp.Damage == nil && sp.LeaseOwner == "" && sp.Owner != "" &&
		sp.Progress != nil && len(sp.Progress.Output) > 0
	// The rate: bytes committed over the last rateWindow or more (a
	// reference point moves up once it is that old), so that it follows
	// the commits' pace, not one interval's, and falls to 0 once the
	// watermark stops: the leased rows are redone every few refreshes.
	rt, ok := rates[id]
	switch {
	case !ok || r.Watermark < rt.wm:
		rt = rate{at: now, wm: r.Watermark, prevAt: now, prevWm: r.Watermark}
	default:
		if dt := now.Sub(rt.at); dt >= time.Second {
			rt.bps = float64(r.Watermark-rt.wm) / dt.Seconds()
		}
		if now.Sub(rt.at) >= rateWindow {
			rt.at, rt.wm = rt.prevAt, rt.prevWm
		}
		rt.prevAt, rt.prevWm = now, r.Watermark
	}
	rates[id] = rt
	if r.State == "leased" {
		r.Rate = int64(rt.bps)
		if rt.bps > 0 && r.Left > 0 {
			r.ETA = age(time.Duration(float64(r.Left) / rt.bps * float64(time.Second)))
		}
	}
	return r
}

// rateWindow is the least span a split's rate is measured over.
const rateWindow = 10 * time.Second

// outputFile is the output file a commit's committable names ("" when it
// names none the view can read).
func outputFile(out []byte) string {
	if len(out) == 0 || out[0] != '{' {
		return ""
	}
	var c struct {
		File   string `json:"file"`
		Object string `json:"object"`
		Key    string `json:"key"`
	}
	if json.Unmarshal(out, &c) != nil {
		return ""
	}
	return cmp.Or(c.File, c.Object, c.Key)
}

// count adds (sign 1) or takes away (sign -1) r's share of the summary's
// counts and sums: a changed row costs the summary O(1).
func (s *summary) count(r row, sign int) {
	switch r.State {
	case string(spate.StatusDamaged):
		s.Damaged += sign
	case string(spate.StatusCompleted):
		s.Completed += sign
	case string(spate.StatusQuarantined):
		s.Quarantined += sign
	case "leased":
		s.Leased += sign
		s.Rate += float64(sign) * float64(r.Rate) // integers: exact, no drift
	case "parked":
		s.Parked += sign
	default:
		s.Runnable += sign
	}
	if r.Pending {
		s.Pending += sign
	}
	s.Splits += sign
	s.BytesTotal += int64(sign) * int64(max(r.Weight, 1))
	s.BytesDone += int64(sign) * r.done
}

// finished is s with its state and ETA derived from its counts.
func (s summary) finished(final bool) summary {
	switch {
	case final && s.Splits > 0 && s.Completed == s.Splits:
		s.State = "complete"
	case !final:
		s.State = "following" // an open plan: a continuous job (as spate inspect says)
	case s.Leased == 0 && s.Parked == 0 && s.Runnable == 0 && s.Completed < s.Splits:
		s.State = "stalled"
	default:
		s.State = "running"
	}
	s.ETA = ""
	if left := s.BytesTotal - s.BytesDone; s.Rate > 0 && left > 0 {
		s.ETA = age(time.Duration(float64(left) / s.Rate * float64(time.Second)))
	}
	return s
}

// membersOf is the members' lines: from the job's meta, and the leased
// rows, parked ones too (what each holds, its bytes left and rate).
func membersOf(meta *spate.JobState, leader string, beats map[string]beat, now time.Time, leased iter.Seq[row]) []member {
	members := map[string]*member{}
	for _, m := range meta.Members {
		members[m.Instance] = &member{Instance: m.Instance, Leader: m.Instance == leader, Lanes: m.MaxInFlight, Assigned: len(meta.Assignments[m.Instance]),
			Beat: beatAge(beats, m.Instance, now)}
	}
	for r := range leased {
		if m := members[r.Lease]; m != nil {
			m.Held++
			m.Rate += r.Rate
			if r.Left > 0 {
				m.Left += r.Left
			}
		}
	}
	out := make([]member, 0, len(members))
	for _, id := range slices.Sorted(maps.Keys(members)) {
		out = append(out, *members[id])
	}
	return out
}

// beatAge is a member's Beat: whole seconds, so that the members' lines
// change once a second, not at every update.
func beatAge(beats map[string]beat, inst string, now time.Time) string {
	b, ok := beats[inst]
	if !ok {
		return ""
	}
	d := now.Sub(b.at).Truncate(time.Second)
	switch {
	case !b.seen:
		return ">" + age(d)
	case d < time.Second:
		return "<1s"
	}
	return age(d)
}

// age renders a duration as an operator reads it: <1s, 12s, 3m05s, 2h05m
// (the page's script renders the ages it updates the same way).
func age(d time.Duration) string { return humanize.Duration(d) }

// chart is the progress chart's polylines, drawn by the page as inline
// SVG in 600×120 boxes: done and total bytes over the time kept, and each
// member's committed-bytes rate over the same time.
type chart struct {
	Done    string   `json:"done"`  // SVG points
	Total   string   `json:"total"` // SVG points
	Span    string   `json:"span"`  // the time the chart covers
	Workers []series `json:"workers"`
	Peak    string   `json:"peak"` // the rate at the top of the workers' chart
}

// series is one member's line of the workers' chart.
type series struct {
	Name   string `json:"name"`
	Color  string `json:"color"`
	Points string `json:"points"`
}

const (
	chartW, chartH = 600.0, 120.0
	maxSeries      = 8 // members drawn; the others are left out
)

// palette colours the members' lines (Tableau 10, readable on white).
var palette = [maxSeries]string{"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f"}

func chartOf(hs []sample) chart {
	if len(hs) == 0 {
		return chart{}
	}
	t0, t1 := hs[0].At, hs[len(hs)-1].At
	span := t1.Sub(t0).Seconds()
	xOf := func(at time.Time) float64 {
		if span <= 0 {
			return chartW
		}
		return at.Sub(t0).Seconds() / span * chartW
	}
	pt := func(b []byte, x, y float64) []byte {
		b = strconv.AppendFloat(b, x, 'f', 1, 64)
		b = append(b, ',')
		b = strconv.AppendFloat(b, y, 'f', 1, 64)
		return append(b, ' ')
	}
	var top int64 = 1
	for _, s := range hs {
		top = max(top, s.Total)
	}
	y := func(v, top int64) float64 { return chartH - float64(v)/float64(top)*chartH }
	done := make([]byte, 0, 12*len(hs)+12)
	total := make([]byte, 0, 12*len(hs)+12)
	if len(hs) == 1 {
		done, total = pt(done, 0, y(hs[0].Done, top)), pt(total, 0, y(hs[0].Total, top))
	}
	for _, s := range hs {
		x := xOf(s.At)
		done, total = pt(done, x, y(s.Done, top)), pt(total, x, y(s.Total, top))
	}
	c := chart{Done: string(done), Total: string(total), Span: age(t1.Sub(t0))}

	// The members' rates, on a scale of the highest seen.
	names := map[string]bool{}
	var peak int64 = 1
	for _, w := range hs {
		for n, r := range w.Rates {
			names[n] = true
			peak = max(peak, r)
		}
	}
	for i, n := range slices.Sorted(maps.Keys(names)) {
		if i == maxSeries {
			break
		}
		b := make([]byte, 0, 12*len(hs)+12)
		for _, w := range hs {
			if r, ok := w.Rates[n]; ok {
				b = pt(b, xOf(w.At), y(r, peak))
			}
		}
		c.Workers = append(c.Workers, series{Name: n, Color: palette[i], Points: string(b)})
	}
	c.Peak = humanize.Bytes(peak) + "/s"
	return c
}
