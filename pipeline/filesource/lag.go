package filesource

import (
	"cmp"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/spate-go/spate"
)

// Why a tail split completed, as its last commit records it.
const (
	endFinal   = "final"    // the plan became final (--until-idle): read to its end
	endDeleted = "deleted"  // the file was deleted: read to the end of what it held
	endGone    = "gone"     // the file was gone when a worker opened the split
	endIdle    = "released" // renamed away and idle (earlier versions; such a split now parks, see tailLane.parked)
	endRefused = "refused"  // its bytes are not text: none shipped
)

// EndReason says for people why a followed file's split completed, from
// the reason its last commit recorded ("" when none is recorded).
func EndReason(end string) string {
	switch end {
	case endFinal:
		return "the plan became final (--until-idle): the file was read to its end"
	case endDeleted:
		return "the file was deleted: what it held was read to its end"
	case endGone:
		return "the file was gone when a worker opened the split: complete at its last commit"
	case endIdle:
		return "the file was renamed away (or left out by the patterns) and idle: read to its end, its lane freed"
	case endRefused:
		return "the file's bytes are not text: refused, none shipped"
	}
	return ""
}

// Followed is a followed file's split as its records hold it: the name
// the planner found the file under, where it is now, and what its last
// commit recorded.
type Followed struct {
	Found string // where the planner found it, relative to the root
	Name  string // where it is now, as its last commit saw it (Found unless renamed)
	FileID
	// Committed is the file offset up to which its lines are committed.
	Committed int64
	// Size is the file's size at the last commit (0 before one).
	Size int64
	// Lag is what the file held beyond Committed at the last commit.
	Lag int64
	// End is why the split completed (see [EndReason]); "" while it runs.
	End string
}

// FollowedOf reads a split's descriptor and progress; ok is false for a
// split that does not follow a file.
func FollowedOf(descriptor []byte, p *spate.SplitProgress) (Followed, bool) {
	if len(descriptor) == 0 {
		return Followed{}, false
	}
	d, err := DecodeDescriptor(descriptor)
	if err != nil || d.Tail == nil {
		return Followed{}, false
	}
	f := Followed{Found: d.Tail.Name, Name: d.Tail.Name, FileID: d.Tail.FileID}
	if p == nil {
		return f, true
	}
	st, err := decodeTailState(p.State)
	if err != nil {
		return f, true
	}
	if st.Name != "" {
		f.Name = st.Name
	}
	f.Committed = max(p.Watermark-st.Base, 0)
	f.Size = st.Size
	f.Lag = max(st.Size-f.Committed, 0)
	f.End = st.End
	return f, true
}

// FileLag is how far a followed file's committed output is behind the
// file.
type FileLag struct {
	Split string
	Followed
	// Bytes is what the file holds beyond its committed offset: its size
	// now, when the file could be looked at, else as the last commit saw it.
	Bytes int64
	// Age is how old the oldest unread byte is, at most: the time since
	// the file was last seen no longer than its committed offset (a
	// sample, or a commit that recorded no lag, or the file's birth for a
	// file never committed). 0 when nothing is behind.
	Age time.Duration
	// Seen: Bytes is the file's size now, not the last commit's record.
	Seen bool
	// Waiting: no live lease holds the split (it waits for a lane).
	Waiting bool
	// ModTime is the file's last write, when Seen.
	ModTime time.Time
}

// LagMeter measures the lag of a job's followed files: it looks at each
// live split's file under the root (at the name its last commit saw, or
// where the planner found it, checked by identity) and remembers, per
// split, the sizes it saw the file at and when: the oldest unread byte
// (at the committed offset) was written after the last look that saw the
// file no longer than that offset, which bounds its age. A file written
// all the time is never seen with nothing behind, but its commits pass
// what earlier looks saw. It is safe for concurrent use.
type LagMeter struct {
	root string
	now  func() time.Time

	mu       sync.Mutex
	caughtUp map[string]*lagTrack // per split
}

// lagTrack is what a LagMeter remembers of a split: since bounds the age
// of its oldest unread byte (written after it), and looks are the sizes
// seen since, each larger than the committed offset when last measured.
type lagTrack struct {
	since time.Time
	looks []sizeAt
}

type sizeAt struct {
	at   time.Time
	size int64
}

// maxLooks bounds the looks a LagMeter keeps per split (a split whose
// commits stopped gains one a sample); past it the oldest go, and the age
// keeps its older, looser bound.
const maxLooks = 1024

// look notes the file's size at now and moves since to the last look
// that saw it no longer than committed.
func (tr *lagTrack) look(now time.Time, size, committed int64) {
	tr.looks = append(tr.looks, sizeAt{now, size})
	last := -1
	for i, l := range tr.looks {
		if l.size <= committed {
			last = i
		}
	}
	if last >= 0 {
		if tr.looks[last].at.After(tr.since) {
			tr.since = tr.looks[last].at
		}
		tr.looks = slices.Delete(tr.looks, 0, last+1)
	}
	if n := len(tr.looks); n > maxLooks {
		tr.looks = slices.Delete(tr.looks, 0, n-maxLooks)
	}
}

// NewLagMeter measures the followed files under root ("" looks at no
// file: what the commits recorded only).
func NewLagMeter(root string) *LagMeter {
	return &LagMeter{root: root, now: time.Now, caughtUp: map[string]*lagTrack{}}
}

// Measure is the lag of every followed file of splits whose split is not
// complete, by name. A split no longer listed is forgotten.
func (m *LagMeter) Measure(splits []spate.SplitState) []FileLag {
	now := m.now()
	var out []FileLag
	m.mu.Lock()
	defer m.mu.Unlock()
	live := make(map[string]bool, len(splits))
	for _, sp := range splits {
		if sp.Status == spate.StatusCompleted || sp.Damage != nil {
			continue
		}
		f, ok := FollowedOf(sp.Descriptor, sp.Progress)
		if !ok {
			continue
		}
		id := sp.ID.String()
		live[id] = true
		fl := FileLag{Split: id, Followed: f, Bytes: f.Lag, Waiting: sp.LeaseOwner == ""}
		if sp.Progress == nil {
			fl.Bytes = -1 // unknown until looked at
		}
		var size int64
		committed := f.Committed
		if info, name, ok := m.look(f); ok {
			fl.Seen, fl.Name, fl.ModTime = true, name, info.ModTime()
			size = info.Size()
			fl.Bytes = max(size-f.Committed, 0)
			if size < f.Committed {
				fl.Bytes = size // truncated: all of it is to read again
				committed = 0
			}
		}
		fl.Bytes = max(fl.Bytes, 0)
		tr := m.caughtUp[id]
		switch {
		case fl.Bytes == 0:
			m.caughtUp[id] = &lagTrack{since: now}
		case tr == nil:
			// First look, and bytes are behind: since when is not known
			// here; what the records say bounds it.
			var last time.Time
			switch {
			case sp.Progress != nil && f.Lag == 0 && !sp.WrittenAt.IsZero():
				last = sp.WrittenAt // nothing was behind at that commit
			case sp.Progress == nil && f.Birth > 0:
				last = time.Unix(0, f.Birth) // never committed: its first byte
			case !sp.WrittenAt.IsZero():
				last = sp.WrittenAt // bytes were behind already then
			case fl.Seen:
				last = fl.ModTime
			default:
				last = now
			}
			tr = &lagTrack{since: last}
			m.caughtUp[id] = tr
		}
		if fl.Bytes > 0 {
			if fl.Seen {
				tr.look(now, size, committed)
			}
			fl.Age = max(now.Sub(tr.since), 0)
		}
		out = append(out, fl)
	}
	for id := range m.caughtUp {
		if !live[id] {
			delete(m.caughtUp, id)
		}
	}
	slices.SortFunc(out, func(a, b FileLag) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Split, b.Split))
	})
	return out
}

// look stats the split's file: at the name its last commit saw, else
// where it was found, each checked to be the file by its identity.
func (m *LagMeter) look(f Followed) (os.FileInfo, string, bool) {
	if m.root == "" {
		return nil, "", false
	}
	for _, name := range []string{f.Name, f.Found} {
		path := filepath.Join(m.root, filepath.FromSlash(name))
		id, err := identify(path)
		if err != nil || id != f.FileID {
			continue
		}
		info, err := os.Stat(path)
		if err != nil {
			continue
		}
		return info, name, true
	}
	return nil, "", false
}

// Identify is the identity of the file at path, as a [Tail] records it
// (Linux only: elsewhere an error).
func Identify(path string) (FileID, error) { return identify(path) }
