package filesource

import (
	"context"
	"path/filepath"
	"time"

	"github.com/spate-go/spate"
)

// DefaultRetain is how long a completed split of a followed file that is
// gone stays in the store (see [PlannerOptions] Retain): a day, long
// enough to inspect what happened to a file rotated away overnight.
const DefaultRetain = 24 * time.Hour

// pruneState is what Prune remembers between its calls: the splits whose
// work it found gone at its last call. A split is pruned only when two
// calls in a row find its work gone, so a file renamed while a listing
// walked past it is not taken for deleted.
type pruneState struct {
	absent map[string]bool
}

// Prune implements [spate.SplitPruner]: of the completed splits of a
// following plan that the plan no longer holds, it returns those whose
// work is gone and whose completion is older than Retain. A tail split's
// work is gone when no file under the root has its file's identity (at
// this listing and the one before); an object's split's, when the bucket
// no longer lists the object. Each one pruned is named in an INFO line.
func (p *Planner) Prune(ctx context.Context, done []spate.DoneSplit) ([]spate.SplitID, error) {
	retain := p.opts.Retain
	if retain == 0 {
		retain = DefaultRetain
	}
	if !p.opts.Follow || retain < 0 {
		return nil, nil
	}
	now := p.opts.Now()
	type due struct {
		id   spate.SplitID
		desc Descriptor
		name string // where the file was last seen
	}
	var dues []due
	for _, d := range done {
		if now.Sub(d.CompletedAt) < retain {
			continue
		}
		desc, err := DecodeDescriptor(d.Spec.Descriptor)
		if err != nil || desc.Tail == nil && len(desc.Files) != 1 {
			continue // not a following plan's split
		}
		name := ""
		if f, ok := FollowedOf(d.Spec.Descriptor, &d.Progress); ok {
			name = f.Name
		} else {
			name = desc.Files[0].Name
		}
		dues = append(dues, due{id: d.Spec.ID, desc: desc, name: name})
	}
	s := p.follow
	if len(dues) == 0 {
		s.mu.Lock()
		s.prune.absent = nil
		s.mu.Unlock()
		return nil, nil
	}
	members, err := p.objs.List(ctx)
	if err != nil {
		return nil, err
	}
	dir, local := p.objs.(LocalDir)
	names := make(map[string]bool, len(members))
	var ids map[FileID]bool
	for _, m := range members {
		names[m.Name] = true
	}
	if local {
		ids = make(map[FileID]bool, len(members))
		for _, m := range members {
			if id, err := identify(filepath.Join(dir.LocalRoot(), filepath.FromSlash(m.Name))); err == nil {
				ids[id] = true
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	absent := map[string]bool{}
	var out []spate.SplitID
	for _, d := range dues {
		var gone bool
		switch {
		case d.desc.Tail != nil && local:
			gone = !ids[d.desc.Tail.FileID]
		case d.desc.Tail == nil && !local:
			gone = !names[d.desc.Files[0].Name]
		}
		if !gone {
			continue
		}
		absent[d.id.String()] = true
		if s.prune.absent[d.id.String()] {
			out = append(out, d.id)
			s.log.Info("pruning the split of a followed file that is gone: its completion is past the retention",
				"file", quoteName(d.name), "split", d.id, "retain", retain)
		}
	}
	s.prune.absent = absent
	return out, nil
}

var _ spate.SplitPruner = (*Planner)(nil)
