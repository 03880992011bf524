package filesource

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/spate-go/spate"
)

// FileID is a file's identity, which a rename keeps and a new file at the
// same path does not: its device, its inode and, where the filesystem
// records one, its birth time (Unix nanoseconds; 0 when unknown), which
// tells a reused inode from the file that had it before.
type FileID struct {
	Dev   uint64 `json:"dev"`
	Ino   uint64 `json:"ino"`
	Birth int64  `json:"birth,omitempty"`
}

// Tail is a followed file, as the planner found it.
type Tail struct {
	// Name is where the planner found the file, relative to the root. A
	// lane that finds another file there (the file was renamed) looks for
	// the file by its identity.
	Name string `json:"name"`
	FileID
}

// tailJSON is a Tail's descriptor form: its name is encoded as a
// [Member]'s is.
type tailJSON struct {
	descName
	FileID
}

// MarshalJSON encodes the name losslessly (see [Member]).
func (t Tail) MarshalJSON() ([]byte, error) {
	return json.Marshal(tailJSON{descName: encodeName(t.Name), FileID: t.FileID})
}

// UnmarshalJSON decodes what MarshalJSON encodes.
func (t *Tail) UnmarshalJSON(b []byte) error {
	var j tailJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	name, err := j.decode()
	if err != nil {
		return err
	}
	*t = Tail{Name: name, FileID: j.FileID}
	return nil
}

// LocalDir is implemented by inputs that are a local directory: only
// their files can be followed as they grow.
type LocalDir interface {
	// LocalRoot is the directory's path.
	LocalRoot() string
}

// LocalRoot implements [LocalDir].
func (d dirObjects) LocalRoot() string { return d.root }

// TailSplitID derives a tail split's id from its file's identity alone:
// the file keeps its split through renames.
func TailSplitID(id FileID) spate.SplitID {
	h := sha256.New()
	var buf [8]byte
	h.Write([]byte("tail"))
	for _, v := range []uint64{PackingVersion, id.Dev, id.Ino, uint64(id.Birth)} {
		binary.BigEndian.PutUint64(buf[:], v)
		h.Write(buf[:])
	}
	sum := h.Sum(nil)
	return spate.MustSplitID("t1" + base64.RawURLEncoding.EncodeToString(sum[:16]))
}

// TailSplitFor is the split spec of a followed file. Its weight is the
// file's size when found (at least 1): what is known of its work.
func TailSplitFor(m Member, id FileID) (spate.SplitSpec, error) {
	desc, err := json.Marshal(Descriptor{Version: PackingVersion, Tail: &Tail{Name: m.Name, FileID: id}})
	if err != nil {
		return spate.SplitSpec{}, fmt.Errorf("filesource: encode descriptor: %w", err)
	}
	return spate.NewSplitSpec(TailSplitID(id), desc).WithWeight(uint64(max(m.Size, 1))), nil
}

// followCursor is a following plan's cursor: a digest of the last
// listing and when the listing last changed. It stays a few bytes however
// many files the input holds.
type followCursor struct {
	Digest  uint64 `json:"digest"`
	Changed int64  `json:"changed_ms"` // Unix milliseconds
}

// planFollow plans a continuous job: a tail split per file of a local
// directory (a bounded split per object of a bucket), an Open plan, and
// Final once the input has been idle for UntilIdle.
func (p *Planner) planFollow(members []Member, pc spate.PlanContext) (spate.SplitPlan, error) {
	if p.follow.ferr != nil {
		return spate.SplitPlan{}, p.follow.ferr
	}
	dir, local := p.objs.(LocalDir)
	splits := make([]spate.PlannedSplit, 0, len(members))
	h := fnv.New64a()
	var buf [8]byte
	present := make(map[FileID]bool, len(members))
	for _, m := range members {
		h.Write([]byte(m.Name))
		binary.BigEndian.PutUint64(buf[:], uint64(m.Size))
		h.Write(buf[:])
		if !p.follow.filter.match(m.Name) {
			continue
		}
		var spec spate.SplitSpec
		var err error
		if local {
			path := filepath.Join(dir.LocalRoot(), filepath.FromSlash(m.Name))
			id, ierr := identify(path)
			if ierr != nil {
				continue // gone since the listing: the next replan sees
			}
			present[id] = true
			if !p.follow.admit(path, m, id) {
				continue
			}
			spec, err = TailSplitFor(m, id)
		} else {
			spec, err = SplitFor([]Member{m})
		}
		if err != nil {
			return spate.SplitPlan{}, err
		}
		splits = append(splits, spate.NewPlannedSplit(spec))
	}
	if local {
		p.follow.forget(present)
	}
	now := p.opts.Now()
	cur := followCursor{Digest: h.Sum64(), Changed: now.UnixMilli()}
	var prev followCursor
	if pc.PlannerState != nil && json.Unmarshal(pc.PlannerState, &prev) == nil && prev.Digest == cur.Digest {
		cur.Changed = prev.Changed
	}
	state, err := json.Marshal(cur)
	if err != nil {
		return spate.SplitPlan{}, fmt.Errorf("filesource: encode cursor: %w", err)
	}
	finality := spate.PlanOpen
	if p.opts.UntilIdle > 0 && now.Sub(time.UnixMilli(cur.Changed)) >= p.opts.UntilIdle {
		finality = spate.PlanFinal
	}
	return spate.NewSplitPlan(splits, finality).WithPlannerState(state), nil
}

// DefaultReleaseAfter is how long a followed file must have been idle
// before its split parks and frees its lane: logrotate's create rotation
// renames the file and the application reopens its log within moments, so
// a file idle this long after its rename is most likely done growing (and
// if it is not, its parked split reads on).
const DefaultReleaseAfter = 5 * time.Second

// minListingGap is the least time between two listings a change of the
// input asks for: a burst of new files makes one or two listings.
const minListingGap = 200 * time.Millisecond

// followState is a planner's file selection (Include/Exclude), what its
// following plans saw of the files (which were refused as not text), and
// the listings the input's changes ask for.
type followState struct {
	filter       fileFilter
	ferr         error
	log          *slog.Logger
	follow       bool
	releaseAfter time.Duration
	discover     time.Duration

	mu sync.Mutex
	// seen are the identities of the files present at the last listing
	// that were admitted ("") or refused (why).
	seen map[FileID]string
	// asks are the channels of the PlanTriggers calls (one per
	// coordinator that uses the planner): each carries the requests for
	// a listing (a lane that saw its file renamed; the watch and the
	// Discover tick of that call).
	asks []chan struct{}
	// prune is what Prune remembers between its calls.
	prune pruneState
}

func newFollowState(opts PlannerOptions) *followState {
	f, err := newFileFilter(opts)
	if err != nil {
		err = spate.Fatalf("%v", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	ra := opts.ReleaseAfter
	if ra == 0 {
		ra = DefaultReleaseAfter
	}
	return &followState{filter: f, ferr: err, log: log, follow: opts.Follow, releaseAfter: ra, discover: opts.Discover,
		seen: map[FileID]string{}}
}

// selected is members less those the patterns leave out.
func (s *followState) selected(members []Member) ([]Member, error) {
	if s.ferr != nil {
		return nil, s.ferr
	}
	if len(s.filter.include) == 0 && len(s.filter.exclude) == 0 {
		return members, nil
	}
	out := members[:0:0]
	for _, m := range members {
		if s.filter.match(m.Name) {
			out = append(out, m)
		}
	}
	return out, nil
}

// admit decides whether the file m (at path, of identity id) is followed:
// a file whose first bytes are not text (a compressed archive, NUL bytes)
// is refused, and named once in a warning. An empty file is admitted; its
// lane checks its first bytes when they come.
func (s *followState) admit(path string, m Member, id FileID) bool {
	s.mu.Lock()
	why, known := s.seen[id]
	s.mu.Unlock()
	if known {
		return why == ""
	}
	if m.Size == 0 {
		return true // decided when it has bytes
	}
	why = sniffFile(path)
	s.mu.Lock()
	s.seen[id] = why
	s.mu.Unlock()
	if why != "" {
		s.log.Warn("refused to follow a file that is not text: none of its bytes are shipped; leave it out with --exclude (filesource Exclude) to silence this",
			"file", quoteName(m.Name), "found", why, "bytes", m.Size)
	}
	return why == ""
}

// forget drops what was seen of files no longer present.
func (s *followState) forget(present map[FileID]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.seen {
		if !present[id] {
			delete(s.seen, id)
		}
	}
}

// ask requests a listing soon (it never blocks).
func (s *followState) ask() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ch := range s.asks {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// subscribe adds a channel of asks, until ctx ends.
func (s *followState) subscribe(ctx context.Context) chan struct{} {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	s.asks = append(s.asks, ch)
	s.mu.Unlock()
	context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.asks = slices.DeleteFunc(s.asks, func(c chan struct{}) bool { return c == ch })
		s.mu.Unlock()
	})
	return ch
}

// PlanTriggers implements [spate.PlanTrigger]: a following plan of a
// local directory is run again within moments of a file appearing in it
// (a file-system watch, where the platform has one), of a lane of this
// process seeing its file renamed away, and every Discover. Until ctx
// ends.
func (p *Planner) PlanTriggers(ctx context.Context) <-chan struct{} {
	out := make(chan struct{}, 1)
	s := p.follow
	dir, local := p.objs.(LocalDir)
	if !s.follow || !local {
		return out
	}
	asks := s.subscribe(ctx)
	ask := func() {
		select {
		case asks <- struct{}{}:
		default:
		}
	}
	if w := watchDir(ctx, dir.LocalRoot(), s.log, ask); w != nil {
		defer func() {
			go func() { <-ctx.Done(); w.Close() }()
		}()
	}
	go func() {
		var tick <-chan time.Time
		if s.discover > 0 {
			t := time.NewTicker(s.discover)
			defer t.Stop()
			tick = t.C
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-asks:
			case <-tick:
			}
			select {
			case out <- struct{}{}:
			default:
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(minListingGap):
			}
		}
	}()
	return out
}

var _ spate.PlanTrigger = (*Planner)(nil)
