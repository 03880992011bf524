package spate

import (
	"errors"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spate-go/spate/internal/jobfollow/hook"
)

// jobFollower keeps a job's state current from its records one at a
// time, as a watch of the job's two keyspaces delivers them: a live view
// pays for what changed, not for the job's size. [InspectJob] is a
// follower fed by one listing of each keyspace, so both read records the
// same way (strictly; an unreadable split record shows as damage on its
// split).
//
// A follower is not safe for concurrent use.
type jobFollower struct {
	fingerprint string // the one wanted; "" takes the plan's
	plan        *PlanState
	planErr     error
	fp          uint64
	leader      *LeaderState
	members     map[string]MemberState
	assignments map[string][]string
	splits      map[string]*followedSplit
	deferred    bool // split records are kept raw until Decode
}

// followedSplit is one split's raw records and what they decode to.
type followedSplit struct {
	progress, spec []byte // nil: absent
	revision       uint64
	// The spec as read, kept: a commit rewrites the progress record only.
	specRead   bool
	specWeight uint64
	specDesc   []byte
	specErr    error
	lease      string
	state      SplitState
	visible    bool // a progress record or damage: InspectJob lists it
}

// touched says what one record changed (internal/jobfollow/hook declares
// it, for the job view).
type touched = hook.Touched

// The job view (internal/jobview) reaches the follower through
// internal/jobfollow (its method set is jobfollow.Follower): it is not part
// of this package's API.
func init() {
	hook.New = func(fingerprint string) any { return newJobFollower(fingerprint) }
}

// newJobFollower returns a follower of a job with no records yet.
// fingerprint, when non-empty, must match the job's plan (as for
// [InspectJob]).
func newJobFollower(fingerprint string) *jobFollower {
	return &jobFollower{
		fingerprint: fingerprint,
		members:     map[string]MemberState{},
		assignments: map[string][]string{},
		splits:      map[string]*followedSplit{},
	}
}

// Apply folds one watch event of keyspace ks: a put (value at revision)
// or a delete of key. Other event kinds touch nothing. It returns what
// the record touched, and an error only for a record that is not the
// damage of one split (the plan's, which State reports
// too).
func (f *jobFollower) Apply(ks Keyspace, ev WatchEvent) (touched, error) {
	switch ev.Kind {
	case WatchPut, WatchDelete:
	default:
		return touched{}, nil
	}
	del := ev.Kind == WatchDelete
	key := ev.Key
	if ks == Durable {
		switch {
		case key == keyPlan:
			return touched{Job: true}, f.setPlan(ev.Value, del)
		case strings.HasPrefix(key, prefixSplit):
			id := key[len(prefixSplit):]
			s := f.split(id)
			s.progress, s.revision = nil, 0
			if !del {
				s.progress, s.revision = ev.Value, ev.Revision
			}
			return touched{Split: id}, f.decode(id, s)
		case strings.HasPrefix(key, prefixSpec):
			id := key[len(prefixSpec):]
			s := f.split(id)
			s.spec, s.specRead = nil, false
			if !del {
				s.spec = ev.Value
			}
			return touched{Split: id}, f.decode(id, s)
		case strings.HasPrefix(key, prefixAssign):
			inst := key[len(prefixAssign):]
			delete(f.assignments, inst)
			if !del {
				if a, err := decodeAssignment(key, ev.Value); err == nil {
					f.assignments[inst] = a.Splits
				}
			}
			return touched{Job: true}, nil
		}
		return touched{}, nil
	}
	switch {
	case key == keyLeader:
		f.leader = nil
		if !del {
			if l, err := decodeLeader(ev.Value); err == nil {
				f.leader = &LeaderState{Instance: l.Owner, Generation: l.Generation}
			}
		}
		return touched{Job: true}, nil
	case strings.HasPrefix(key, prefixWorker):
		inst := key[len(prefixWorker):]
		delete(f.members, inst)
		if !del {
			m := MemberState{Instance: inst}
			if w, err := decodeWorker(key, ev.Value); err == nil {
				m.MaxInFlight = w.MaxInFlight
			}
			f.members[inst] = m
		}
		return touched{Job: true, Member: inst}, nil
	case strings.HasPrefix(key, prefixSplit):
		id := key[len(prefixSplit):]
		s := f.split(id)
		s.lease = ""
		if !del {
			if l, err := decodeLease(key, ev.Value); err == nil {
				s.lease = l.Owner
			}
		}
		s.state.LeaseOwner = s.lease
		f.gc(id, s)
		return touched{Split: id}, nil
	}
	return touched{}, nil
}

func (f *jobFollower) split(id string) *followedSplit {
	s := f.splits[id]
	if s == nil {
		s = &followedSplit{}
		f.splits[id] = s
	}
	return s
}

// gc forgets a split none of whose records is left.
func (f *jobFollower) gc(id string, s *followedSplit) {
	if s.progress == nil && s.spec == nil && s.lease == "" {
		delete(f.splits, id)
	}
}

func (f *jobFollower) setPlan(value []byte, del bool) error {
	f.plan, f.planErr = nil, nil
	if !del {
		var plan planRecord
		if err := decodeStrict(value, &plan, &plan.Schema); err != nil {
			f.planErr = recordError(Durable, keyPlan, err)
		} else {
			want := f.fingerprint
			if want == "" {
				want = plan.Fingerprint
			}
			p, err := decodePlan(keyPlan, value, want)
			if err != nil {
				f.planErr = err
			} else {
				ps := &PlanState{Fingerprint: p.Fingerprint, Generation: p.Generation, Planned: p.Planned}
				if p.Finality == finalityFinal {
					ps.Finality = PlanFinal
				}
				if p.PlannerState != nil {
					ps.PlannerState = *p.PlannerState
				}
				f.plan = ps
			}
		}
	}
	// The fingerprint hash is what a split record is checked against: a
	// new one (the first plan) re-reads every split.
	fp := uint64(0)
	if f.plan != nil {
		fp = fingerprintHash(f.plan.Fingerprint)
	}
	if fp == f.fp {
		return f.planErr
	}
	f.fp = fp
	var firstErr error
	for id, s := range f.splits {
		s.specRead = false
		if err := f.decode(id, s); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if f.planErr != nil {
		return f.planErr
	}
	return firstErr
}

// decode reads s's records into its state, as InspectJob shows it.
func (f *jobFollower) decode(id string, s *followedSplit) error {
	defer f.gc(id, s)
	if f.deferred {
		return nil // read by Decode
	}
	return f.read(id, s)
}

// read is decode without forgetting an empty split: safe to run for
// different splits at once.
func (f *jobFollower) read(id string, s *followedSplit) error {
	st := SplitState{ID: SplitID{id: id}, Revision: s.revision, LeaseOwner: s.lease}
	s.state, s.visible = st, false
	var own *progressRecord // a divided split's record: its own descriptor and weight
	if f.plan == nil {
		return nil // read once the plan is
	}
	if s.progress != nil {
		r, err := decodeProgress(keySplit(id), id, s.progress, f.fp)
		switch {
		case err != nil && !isDamage(err):
			return err
		case err != nil:
			st.Status, st.Damage, st.DamageFix = StatusDamaged, err, damageFix(keySplit(id))
		default:
			st.Status, st.Owner, st.Epoch, st.Attempts, st.Progress, st.LastFailure =
				SplitStatus(r.Status), r.owner(), LeaseEpoch(r.Epoch), r.Attempts, r.progress(), r.LastFailure
			if r.Descriptor != nil {
				own = r
			}
			if r.WrittenAtMs > 0 {
				st.WrittenAt = time.UnixMilli(r.WrittenAtMs)
			}
		}
	}
	if s.spec != nil {
		if !s.specRead {
			s.specWeight, s.specDesc, s.specErr = 0, nil, nil
			r, err := decodeSpec(keySpec(id), id, s.spec, f.fp)
			if err != nil {
				s.specErr = err
			} else {
				s.specWeight, s.specDesc = r.Weight, r.Descriptor
			}
			s.specRead = true
		}
		switch err := s.specErr; {
		case err != nil && !isDamage(err):
			return err
		case err != nil:
			if st.Damage == nil {
				st.Damage, st.DamageFix = err, damageFix(keySpec(id))
			}
		default:
			st.Weight, st.HasSpec, st.Descriptor = s.specWeight, true, s.specDesc
			if own != nil {
				// What its divisions kept: their residuals are splits of
				// their own, and counting them here too would count them twice.
				st.Weight, st.Descriptor = max(own.Weight, 1), own.Descriptor
			}
		}
	}
	if st.Status == "" && st.Damage != nil {
		st.Status = StatusDamaged
	}
	// A spec without its progress record is seeding in flight: not shown.
	s.state, s.visible = st, st.Status != ""
	return nil
}

// Defer makes Apply keep split records unread until Decode,
// which reads them on every core: for folding a snapshot of a large job
// (each record is decoded strictly, which is most of the cost).
func (f *jobFollower) Defer() { f.deferred = true }

// Decode reads the records Apply kept since Defer, and ends
// it; it returns the first error Apply would have.
func (f *jobFollower) Decode() error {
	if !f.deferred {
		return nil
	}
	f.deferred = false
	ids := slices.Collect(maps.Keys(f.splits))
	workers := min(runtime.GOMAXPROCS(0), max(len(ids)/256, 1))
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(ids); i += workers {
				if err := f.read(ids[i], f.splits[ids[i]]); err != nil && errs[w] == nil {
					errs[w] = err
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Split returns one split's state, as [InspectJob] would list it.
func (f *jobFollower) Split(id string) (SplitState, bool) {
	s := f.splits[id]
	if s == nil || !s.visible {
		return SplitState{}, false
	}
	return s.state, true
}

// Meta is the job's state without its splits: plan, leader, members
// (sorted) and assignments. Its cost grows with the members, not the
// splits. It fails as [InspectJob] does while the plan is missing or
// unreadable.
func (f *jobFollower) Meta() (*JobState, error) {
	if f.planErr != nil {
		return nil, f.planErr
	}
	if f.plan == nil {
		return nil, noPlanError()
	}
	js := &JobState{Plan: *f.plan, Leader: f.leader, Assignments: maps.Clone(f.assignments)}
	for _, inst := range slices.Sorted(maps.Keys(f.members)) {
		js.Members = append(js.Members, f.members[inst])
	}
	return js, nil
}

// State is the whole job, splits sorted by id.
func (f *jobFollower) State() (*JobState, error) {
	js, err := f.Meta()
	if err != nil {
		return nil, err
	}
	// Sorted by id, not by state: a state is large to move.
	ids := make([]string, 0, len(f.splits))
	for id, s := range f.splits {
		if s.visible {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	js.Splits = make([]SplitState, len(ids))
	for i, id := range ids {
		js.Splits[i] = f.splits[id].state
	}
	return js, nil
}
