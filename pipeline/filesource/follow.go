package filesource

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"path/filepath"
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
	dir, local := p.objs.(LocalDir)
	splits := make([]spate.PlannedSplit, 0, len(members))
	h := fnv.New64a()
	var buf [8]byte
	for _, m := range members {
		h.Write([]byte(m.Name))
		binary.BigEndian.PutUint64(buf[:], uint64(m.Size))
		h.Write(buf[:])
		var spec spate.SplitSpec
		var err error
		if local {
			id, ierr := identify(filepath.Join(dir.LocalRoot(), filepath.FromSlash(m.Name)))
			if ierr != nil {
				continue // gone since the listing: the next replan sees
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
