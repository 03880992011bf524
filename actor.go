package spate

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"
)

// rewatchDelay is how long the actor waits before re-establishing a broken
// watch.
const rewatchDelay = 200 * time.Millisecond

// splitView is the local view of one split: its progress record (nil until
// seen: a lease or spec may arrive first), its spec and its live lease.
type splitView struct {
	prog     *progressRecord
	progRev  uint64
	spec     *specRecord
	lease    *leaseVal // nil: no live lease
	leaseRev uint64    // highest lease revision seen (put or delete)
}

// tenancy is one split this worker holds.
type tenancy struct {
	epoch    uint64
	leaseRev uint64
	lastOK   time.Time // last successful lease write
}

// revocation is a cooperative revocation in progress on this worker.
type revocation struct {
	started      time.Time
	lastProgress time.Time
	cancelled    bool
}

type leadership struct {
	rev         uint64    // the leader key's revision we hold
	generation  uint64    // the plan generation we lead under
	settleUntil time.Time // no assignment before this (a new job's start)
}

type assignEntry struct {
	val *assignmentVal
	rev uint64
}

// watchState is one keyspace's watch.
type watchState struct {
	ks         Keyspace
	ch         <-chan WatchEvent // nil while down
	cancel     context.CancelFunc
	collecting bool // between (re)establishment and SnapshotDone
	snapshot   []WatchEvent
}

// actor owns every store operation and the local view of one coordinator.
type actor struct {
	c       *StoreCoordinator
	cfg     Config
	st      Store
	log     *slog.Logger
	m       *coordMetrics
	self    string
	nonce   string
	fp      string
	fpHash  uint64
	planner SplitPlanner
	ctx     context.Context

	jitterSeed uint64
	beatRound  uint64

	// The view.
	splits      map[string]*splitView
	nSplits     int // splits with a progress record
	nCompleted  int
	nQuarant    int
	presence    map[string]uint64 // instance -> presence key revision
	caps        map[string]int
	loggedPeers map[string]bool
	joinLogged  bool
	leaderObs   *leaderVal
	leaderRev   uint64
	plan        *planRecord
	planRev     uint64
	assigns     map[string]assignEntry
	durableSeq  uint64 // bumps on every durable change (gates terminal listing)
	terminalAt  uint64

	// This worker.
	owned          map[string]*tenancy
	selfFenced     map[string]uint64 // splits this process self-fenced, at their epoch
	forgiven       map[string]bool   // self-fenced splits already re-claimed attempt-free once
	assigned       map[string]bool
	assignSeen     bool
	assignGen      uint64
	awaiting       map[string]time.Time
	revocations    map[string]*revocation
	departed       map[string]time.Time
	leading        *leadership
	presenceRev    uint64
	dirty          bool
	quarantineScan bool
	parting        bool
	terminal       bool

	// Planning.
	planDue     bool
	planRunning bool
	planCancel  context.CancelFunc
	planDone    chan planResult

	watches [2]*watchState
	rewatch *time.Timer
}

func newActor(c *StoreCoordinator, planner SplitPlanner, fp string) *actor {
	h := fnv.New64a()
	h.Write([]byte(c.cfg.InstanceID + "/" + c.nonce))
	return &actor{
		c: c, cfg: c.cfg, st: c.store, log: c.log, m: c.m,
		self: c.cfg.InstanceID, nonce: c.nonce, fp: fp, fpHash: FingerprintHash(fp), planner: planner,
		jitterSeed:  h.Sum64(),
		splits:      map[string]*splitView{},
		presence:    map[string]uint64{},
		caps:        map[string]int{},
		loggedPeers: map[string]bool{},
		assigns:     map[string]assignEntry{},
		owned:       map[string]*tenancy{},
		selfFenced:  map[string]uint64{},
		forgiven:    map[string]bool{},
		assigned:    map[string]bool{},
		awaiting:    map[string]time.Time{},
		revocations: map[string]*revocation{},
		departed:    map[string]time.Time{},
		planDone:    make(chan planResult, 1),
		watches:     [2]*watchState{{ks: Ephemeral}, {ks: Durable}},
	}
}

func (a *actor) run(ctx context.Context) {
	a.ctx = ctx
	a.rewatch = time.NewTimer(time.Hour)
	a.rewatch.Stop()
	defer func() {
		for _, w := range a.watches {
			if w.cancel != nil {
				w.cancel()
			}
		}
		if a.planCancel != nil {
			a.planCancel()
		}
		if a.planRunning {
			<-a.planDone // the planner goroutine must not outlive the actor
		}
		a.m.leader.Set(0)
		a.m.splitsOwned.Set(0)
	}()
	if err := a.startup(ctx); err != nil {
		if ctx.Err() == nil {
			a.log.Error("coordinator failed to start", "err", err)
			a.c.fail(err)
		}
		return
	}
	heartbeat := time.NewTimer(a.beatInterval())
	reconcile := time.NewTicker(a.cfg.ReconcileInterval)
	replan := time.NewTicker(a.cfg.ReplanInterval)
	defer heartbeat.Stop()
	defer reconcile.Stop()
	defer replan.Stop()
	defer a.rewatch.Stop()

	if err := a.step(); err != nil {
		a.die(err)
		return
	}
	for {
		var err error
		select {
		case <-ctx.Done():
			return
		case cmd := <-a.c.cmds:
			err = a.handle(cmd)
			// Serve whatever else queued up before stepping.
		drain:
			for err == nil {
				select {
				case cmd := <-a.c.cmds:
					err = a.handle(cmd)
				default:
					break drain
				}
			}
		case ev, ok := <-a.watches[0].ch:
			err = a.onWatch(a.watches[0], ev, ok)
		case ev, ok := <-a.watches[1].ch:
			err = a.onWatch(a.watches[1], ev, ok)
		case <-a.rewatch.C:
			err = a.reestablish(ctx)
		case <-heartbeat.C:
			err = a.heartbeat()
			heartbeat.Reset(a.beatInterval())
		case <-reconcile.C:
			err = a.reconcile()
		case <-replan.C:
			if a.leading != nil && a.plan != nil && a.plan.Finality == finalityOpen {
				a.planDue = true
			}
		case res := <-a.planDone:
			err = a.finishPlan(res)
		}
		if err == nil {
			err = a.step()
		}
		if err != nil {
			a.die(err)
			return
		}
	}
}

func (a *actor) die(err error) {
	if a.ctx.Err() != nil {
		return
	}
	a.log.Error("coordinator stopped on a fatal error", "err", err)
	a.c.fail(err)
}

// beatInterval is a third of the lease scaled by a jitter in [0.8, 1.2)
// derived from this process's seed and the round, so workers drift apart
// instead of herding.
func (a *actor) beatInterval() time.Duration {
	a.beatRound++
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], a.beatRound)
	h := fnv.New64a()
	h.Write(b[:])
	j := 0.8 + 0.4*float64(mix64(h.Sum64()^a.jitterSeed)>>11)/float64(1<<53)
	return time.Duration(float64(a.cfg.LeaseDuration/3) * j)
}

// ----- startup ---------------------------------------------------------

func (a *actor) startup(ctx context.Context) error {
	phases := []struct {
		name string
		f    func(context.Context) error
	}{
		{"store probe (durable)", func(ctx context.Context) error { return a.probe(ctx, Durable) }},
		{"store probe (ephemeral)", func(ctx context.Context) error { return a.probe(ctx, Ephemeral) }},
		{"join", a.join},
		{"announce presence", a.announce},
		{"watch", a.watchAll},
	}
	for _, p := range phases {
		if err := a.budgeted(ctx, p.name, p.f); err != nil {
			return err
		}
	}
	peers := slices.Sorted(maps.Keys(a.presence))
	peers = slices.DeleteFunc(peers, func(p string) bool { return p == a.self })
	for _, p := range peers {
		a.loggedPeers[p] = true
	}
	a.loggedPeers[a.self] = true
	if len(peers) > 0 {
		a.log.Info("joined a fleet already running", "peers", peers)
	} else {
		a.log.Info("joined the job", "generation", a.plan.Generation)
	}
	a.joinLogged = true
	return nil
}

// budgeted retries a Retryable startup phase with backoff from 200ms,
// doubling, capped at 5s, at most StartupMaxAttempts times.
func (a *actor) budgeted(ctx context.Context, name string, f func(context.Context) error) error {
	backoff := 200 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := f(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if KindOf(err) != KindRetryable {
			return err
		}
		if attempt >= a.cfg.StartupMaxAttempts {
			return Fatalf("startup: %s failed %d times, giving up: %w", name, attempt, err)
		}
		a.log.Warn("startup phase failed; retrying", "phase", name, "attempt", attempt, "err", err)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// probe checks, before fencing is trusted to the store, that it enforces
// create-if-absent and compare-and-swap in ks.
func (a *actor) probe(ctx context.Context, ks Keyspace) error {
	// The nonce keeps two processes that share an instance id (twins, found
	// later and named as such) from tripping over each other's probe.
	key := prefixProbe + a.self + "." + a.nonce
	v := []byte(a.nonce)
	o, err := a.st.Create(ctx, ks, key, v)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if !o.Won {
		_, _ = a.st.Delete(ctx, ks, key, AnyRevision)
		return Retryablef("probe: a crashed predecessor left %s key %q; cleared it", ks, key)
	}
	bad := func(format string, args ...any) error {
		return Fatalf("store probe (%s keyspace of the %s store): "+format+"; fencing cannot be trusted to it",
			append([]any{ks, a.st.Capabilities().Driver}, args...)...)
	}
	o2, err := a.st.Create(ctx, ks, key, v)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if o2.Won {
		return bad("a second create of one key won: create-if-absent is not enforced")
	}
	o3, err := a.st.Update(ctx, ks, key, v, o.Revision)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if !o3.Won {
		if gone, err := a.probeKeyGone(ctx, ks, key, o.Revision); err != nil || gone {
			return err
		}
		return bad("an update at the current revision lost: compare-and-swap is broken")
	}
	if o3.Revision <= o.Revision {
		return bad("an update minted revision %d after %d: revisions must strictly increase", o3.Revision, o.Revision)
	}
	o4, err := a.st.Update(ctx, ks, key, v, o.Revision)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if o4.Won {
		return bad("an update at a stale revision won: fencing would corrupt silently")
	}
	o5, err := a.st.Delete(ctx, ks, key, o3.Revision)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if !o5.Won {
		if gone, err := a.probeKeyGone(ctx, ks, key, o3.Revision); err != nil || gone {
			return err
		}
		return bad("a guarded delete at the current revision lost")
	}
	return nil
}

// probeKeyGone tells a probe step that lost because its key is no longer
// the one it wrote at rev (an ephemeral key that expired while the store
// was slow, a predecessor's cleanup) from a store that broke the rule: if
// the key is absent or has moved on, the probe is retried (Retryable
// error); if it still holds revision rev, the loss was the store's fault
// (false, nil).
func (a *actor) probeKeyGone(ctx context.Context, ks Keyspace, key string, rev uint64) (bool, error) {
	e, ok, err := a.st.Get(ctx, ks, key)
	if err != nil {
		return true, fmt.Errorf("probe: %w", err)
	}
	if ok && e.Revision == rev {
		return false, nil
	}
	_, _ = a.st.Delete(ctx, ks, key, AnyRevision)
	return true, Retryablef("probe: %s key %q changed or expired between probe steps; retrying", ks, key)
}

// join reads the plan record (checking the fingerprint before touching
// anything else) or creates it.
func (a *actor) join(ctx context.Context) error {
	e, ok, err := a.st.Get(ctx, Durable, keyPlan)
	if err != nil {
		return fmt.Errorf("join: %w", err)
	}
	if ok {
		p, err := decodePlan(keyPlan, e.Value, a.fp)
		if err != nil {
			return err
		}
		a.plan, a.planRev = p, e.Revision
		return nil
	}
	p := &planRecord{Schema: SchemaVersion, Fingerprint: a.fp, Finality: finalityOpen, UpdatedAtMs: nowMs()}
	o, err := a.st.Create(ctx, Durable, keyPlan, encode(p))
	if err != nil {
		return fmt.Errorf("join: create plan: %w", err)
	}
	if !o.Won {
		return Retryablef("join: lost the race to create the plan record; re-reading")
	}
	a.plan, a.planRev = p, o.Revision
	return nil
}

func (a *actor) presenceValue() []byte {
	return encode(workerVal{Schema: SchemaVersion, Nonce: a.nonce, MaxInFlight: a.cfg.MaxInFlight})
}

func (a *actor) announce(ctx context.Context) error {
	key := prefixWorker + a.self
	o, err := a.st.Create(ctx, Ephemeral, key, a.presenceValue())
	if err != nil {
		return fmt.Errorf("announce: %w", err)
	}
	if o.Won {
		a.presenceRev = o.Revision
		return nil
	}
	e, ok, err := a.st.Get(ctx, Ephemeral, key)
	if err != nil {
		return fmt.Errorf("announce: %w", err)
	}
	if !ok {
		return Retryablef("announce: presence key %q vanished between create and read", key)
	}
	o, err = a.st.Update(ctx, Ephemeral, key, a.presenceValue(), e.Revision)
	if err != nil {
		return fmt.Errorf("announce: %w", err)
	}
	if !o.Won {
		return Retryablef("announce: presence key %q changed under us", key)
	}
	a.presenceRev = o.Revision
	return nil
}

// watchAll establishes both watches and applies their snapshots.
func (a *actor) watchAll(ctx context.Context) error {
	for _, w := range a.watches {
		if w.ch != nil {
			continue
		}
		if err := a.syncWatch(ctx, w); err != nil {
			return err
		}
	}
	return nil
}

// syncWatch opens a watch and applies its snapshot before returning. The
// actor does nothing else meanwhile: the ephemeral snapshot is
// authoritative, so none of this worker's own writes may fall between the
// store taking the snapshot and the actor applying it (such a write would
// be missing from the snapshot and read as a delete).
func (a *actor) syncWatch(ctx context.Context, w *watchState) error {
	if err := a.openWatch(ctx, w); err != nil {
		return err
	}
	deadline := time.NewTimer(3 * a.cfg.OpTimeout)
	defer deadline.Stop()
	for w.collecting {
		select {
		case ev, ok := <-w.ch:
			if err := a.onWatch(w, ev, ok); err != nil {
				return err
			}
			if w.ch == nil {
				return Retryablef("watch %s: the stream broke during its snapshot", w.ks)
			}
		case <-deadline.C:
			a.closeWatch(w)
			return Retryablef("watch %s: snapshot not complete within %v", w.ks, 3*a.cfg.OpTimeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (a *actor) openWatch(ctx context.Context, w *watchState) error {
	wctx, cancel := context.WithCancel(ctx)
	ch, err := a.st.Watch(wctx, w.ks, "")
	if err != nil {
		cancel()
		return fmt.Errorf("watch %s: %w", w.ks, err)
	}
	w.ch, w.cancel, w.collecting, w.snapshot = ch, cancel, true, nil
	return nil
}

func (a *actor) closeWatch(w *watchState) {
	if w.cancel != nil {
		w.cancel()
	}
	w.ch, w.cancel, w.collecting, w.snapshot = nil, nil, false, nil
}

// reestablish retries every watch that is down, every rewatchDelay for as
// long as the failures are Retryable.
func (a *actor) reestablish(ctx context.Context) error {
	for _, w := range a.watches {
		if w.ch != nil {
			continue
		}
		if err := a.syncWatch(ctx, w); err != nil {
			if KindOf(err) == KindFatal {
				return err
			}
			a.log.Warn("re-watch failed; retrying", "keyspace", w.ks, "err", err)
			a.rewatch.Reset(rewatchDelay)
			return nil
		}
	}
	return nil
}

// onWatch handles one watch item.
func (a *actor) onWatch(w *watchState, ev WatchEvent, ok bool) error {
	if !ok || ev.Kind == WatchError {
		if ok {
			a.log.Warn("watch broke; re-watching", "keyspace", w.ks, "err", ev.Err)
		} else {
			a.log.Warn("watch ended; re-watching", "keyspace", w.ks)
		}
		a.closeWatch(w)
		if ok && KindOf(ev.Err) == KindFatal {
			return fmt.Errorf("watch %s: %w", w.ks, ev.Err)
		}
		a.rewatch.Reset(rewatchDelay)
		return nil
	}
	if w.collecting {
		switch ev.Kind {
		case WatchPut:
			w.snapshot = append(w.snapshot, ev)
		case WatchSnapshotDone:
			snap := w.snapshot
			w.collecting, w.snapshot = false, nil
			return a.applySnapshot(w.ks, snap)
		}
		return nil // deletes inside a snapshot are dropped
	}
	switch ev.Kind {
	case WatchPut:
		if w.ks == Ephemeral {
			return a.ephemeralPut(ev.Key, ev.Value, ev.Revision)
		}
		return a.durablePut(ev.Key, ev.Value, ev.Revision, false)
	case WatchDelete:
		if w.ks == Ephemeral {
			return a.ephemeralDelete(ev.Key, ev.Revision, false)
		}
		a.durableDelete(ev.Key)
	}
	return nil
}

// applySnapshot applies a watch snapshot. The ephemeral snapshot is
// authoritative: leases, presence and the observed leader are replaced. The
// durable one merges over the view.
func (a *actor) applySnapshot(ks Keyspace, puts []WatchEvent) error {
	if ks == Ephemeral {
		live := map[string]bool{}
		for _, p := range puts {
			live[p.Key] = true
		}
		if err := a.dropUnlisted(live); err != nil {
			return err
		}
		for _, p := range puts {
			if err := a.ephemeralPut(p.Key, p.Value, p.Revision); err != nil {
				return err
			}
		}
		return nil
	}
	for _, p := range puts {
		if err := a.durablePut(p.Key, p.Value, p.Revision, true); err != nil {
			return err
		}
	}
	return nil
}

// dropUnlisted applies an authoritative delete to every ephemeral key the
// view believes live but that live does not hold.
func (a *actor) dropUnlisted(live map[string]bool) error {
	if a.leaderObs != nil && !live[keyLeader] {
		if err := a.ephemeralDelete(keyLeader, 0, true); err != nil {
			return err
		}
	}
	for _, inst := range slices.Sorted(maps.Keys(a.presence)) {
		if !live[prefixWorker+inst] {
			if err := a.ephemeralDelete(prefixWorker+inst, 0, true); err != nil {
				return err
			}
		}
	}
	for _, id := range slices.Sorted(maps.Keys(a.splits)) {
		if a.splits[id].lease != nil && !live[prefixSplit+id] {
			if err := a.ephemeralDelete(prefixSplit+id, 0, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// ----- applying ephemeral events ----------------------------------------

func (a *actor) view(id string) *splitView {
	v := a.splits[id]
	if v == nil {
		v = &splitView{}
		a.splits[id] = v
	}
	return v
}

func (a *actor) ephemeralPut(key string, value []byte, rev uint64) error {
	switch {
	case key == keyLeader:
		if rev <= a.leaderRev {
			return nil
		}
		l, err := decodeLeader(value)
		if err != nil {
			return err
		}
		a.leaderObs, a.leaderRev = l, rev
		if a.leading != nil && l.Nonce != a.nonce {
			a.demote("the leader key now belongs to " + l.Owner)
		}
	case strings.HasPrefix(key, prefixWorker):
		inst := key[len(prefixWorker):]
		if old, ok := a.presence[inst]; ok && rev <= old {
			return nil
		}
		if _, ok := a.presence[inst]; !ok {
			a.dirty = true
		}
		a.presence[inst] = rev
		if _, ok := a.departed[inst]; ok {
			delete(a.departed, inst) // a returning instance cancels its window
			a.dirty = true
		}
		w, err := decodeWorker(key, value)
		if err != nil {
			a.log.Warn("unreadable presence record; the member keeps the default lane budget", "key", key, "err", err)
		} else if w.MaxInFlight > 0 && a.caps[inst] != w.MaxInFlight {
			a.caps[inst] = w.MaxInFlight
			a.dirty = true
		}
		if inst == a.self && w != nil && w.Nonce == a.nonce {
			a.presenceRev = max(a.presenceRev, rev)
		}
	case strings.HasPrefix(key, prefixSplit):
		id := key[len(prefixSplit):]
		v := a.view(id)
		if rev <= v.leaseRev {
			return nil
		}
		l, err := decodeLease(key, value)
		if err != nil {
			return err
		}
		if _, held := a.owned[id]; held && l.Nonce != a.nonce {
			if l.Owner == a.self {
				return a.twin(id)
			}
			a.dropLost(id, "fenced", "its lease was taken by "+l.Owner)
		}
		if v.lease == nil || v.lease.Owner != l.Owner {
			a.dirty = true
		}
		v.lease, v.leaseRev = l, rev
	}
	return nil
}

func (a *actor) twin(id string) error {
	return Fatalf("two live workers share the instance id %q (found a lease on split %s under our id with another process's nonce); instance ids must be unique among live workers",
		a.self, id)
}

// ephemeralDelete applies a delete (or, with force, an authoritative
// absence from a listing, without a revision check).
func (a *actor) ephemeralDelete(key string, rev uint64, force bool) error {
	switch {
	case key == keyLeader:
		if !force && rev <= a.leaderRev {
			return nil
		}
		a.leaderObs = nil
		if !force {
			a.leaderRev = rev
		}
		if a.leading != nil && (force || rev > a.leading.rev) {
			a.log.Warn("leadership lease expired")
			a.dropLeadership()
		}
	case strings.HasPrefix(key, prefixWorker):
		inst := key[len(prefixWorker):]
		old, ok := a.presence[inst]
		if !ok || !force && rev <= old {
			return nil
		}
		delete(a.presence, inst)
		delete(a.caps, inst)
		a.dirty = true
		if inst != a.self {
			a.departed[inst] = time.Now()
		} else {
			a.presenceRev = 0
		}
	case strings.HasPrefix(key, prefixSplit):
		id := key[len(prefixSplit):]
		v := a.view(id)
		if !force && rev <= v.leaseRev {
			return nil
		}
		if t, held := a.owned[id]; held && (force || rev > t.leaseRev) {
			a.dropLost(id, "starved", "its lease expired: renewals failed for a whole lease")
		}
		if v.lease != nil {
			a.dirty = true
		}
		v.lease = nil
		if !force {
			v.leaseRev = rev
		}
		if p := v.prog; p != nil && p.Status == statusRunnable && int(p.Attempts)+1 >= a.cfg.MaxAttempts {
			a.quarantineScan = true
		}
	}
	return nil
}

// ----- applying durable events ------------------------------------------

// durablePut applies a durable key. auth marks a value read from the store
// (a snapshot, a listing, a get) rather than a live watch event: see upsert.
func (a *actor) durablePut(key string, value []byte, rev uint64, auth bool) error {
	switch {
	case key == keyPlan:
		if rev <= a.planRev {
			return nil
		}
		p, err := decodePlan(key, value, a.fp)
		if err != nil {
			return err
		}
		a.plan, a.planRev = p, rev
		a.durableSeq++
		if a.leading != nil && p.Generation > a.leading.generation {
			a.demote(fmt.Sprintf("a successor bumped the plan generation to %d", p.Generation))
		}
	case strings.HasPrefix(key, prefixSpec):
		id := key[len(prefixSpec):]
		v := a.view(id)
		if v.spec != nil {
			return nil // immutable: the first copy wins
		}
		s, err := decodeSpec(key, id, value, a.fpHash)
		if err != nil {
			return err
		}
		v.spec = s
		if v.prog != nil {
			a.dirty = true
		}
	case strings.HasPrefix(key, prefixSplit):
		id := key[len(prefixSplit):]
		r, err := decodeProgress(key, id, value, a.fpHash)
		if err != nil {
			return err
		}
		a.upsert(id, r, rev, auth)
	case strings.HasPrefix(key, prefixAssign):
		inst := key[len(prefixAssign):]
		if e, ok := a.assigns[inst]; ok && rev <= e.rev {
			return nil
		}
		val, err := decodeAssignment(key, value)
		if err != nil {
			a.log.Warn("ignoring an unreadable assignment record (it is not read as an empty one)", "key", key, "err", err)
			return nil
		}
		a.assigns[inst] = assignEntry{val: val, rev: rev}
		if inst == a.self {
			a.adoptAssignment(val)
		}
	}
	return nil
}

func (a *actor) durableDelete(key string) {
	a.durableSeq++
	switch {
	case strings.HasPrefix(key, prefixAssign):
		inst := key[len(prefixAssign):]
		delete(a.assigns, inst)
		if inst == a.self {
			a.forgetAssignment()
		}
	case strings.HasPrefix(key, prefixProbe):
		a.log.Debug("startup probe key cleared", "key", key)
	default:
		a.log.Warn("durable record deleted externally; reconcile treats it as absent", "key", key)
	}
}

// upsert folds a progress record into the view: the only place progress
// state changes.
//
// A live watch event at or below the held revision is a stale echo. A record
// this worker read from the store, or wrote itself, is authoritative: if its
// revision is below the one held, the store went back in time — a crashed
// server that lost writes readers had already seen (Redis reads see a write
// before its AOF fsync) — and the view adopts what the store now says rather
// than filter every later write as stale.
func (a *actor) upsert(id string, r *progressRecord, rev uint64, auth bool) {
	v := a.view(id)
	if rev <= v.progRev {
		if !auth || rev == v.progRev {
			return // a stale echo, or our own write already folded
		}
		a.log.Warn("the store went back in time: a split record's revision is below one seen before; adopting the store's state",
			"split", id, "seen", v.progRev, "now", rev)
	}
	prev := v.prog
	a.durableSeq++
	if prev == nil {
		a.nSplits++
		a.dirty = true
	} else {
		if prev.owner() != r.owner() || prev.Status != r.Status {
			a.dirty = true
		}
		a.count(prev.Status, -1)
	}
	a.count(r.Status, +1)
	v.prog, v.progRev = r, rev
	if t, held := a.owned[id]; held && r.Epoch > t.epoch {
		a.dropLost(id, "fenced", fmt.Sprintf("a claimant fenced it at epoch %d", r.Epoch))
	}
	// Emit Quarantined once per transition this worker observes (a snapshot
	// of an already quarantined split is no transition).
	if r.Status == statusQuarant && prev != nil && prev.Status != statusQuarant {
		a.c.emit(Quarantined{Split: SplitID{id: id}, Attempts: r.Attempts})
		a.log.Warn("split quarantined: out of delivery attempts; it blocks completion", "split", id, "attempts", r.Attempts)
	}
	if r.Status == statusRunnable && int(r.Attempts)+1 >= a.cfg.MaxAttempts {
		a.quarantineScan = true
	}
}

func (a *actor) count(status string, d int) {
	switch status {
	case statusCompleted:
		a.nCompleted += d
	case statusQuarant:
		a.nQuarant += d
	}
}

// adoptAssignment replaces this worker's instruction, unless a deposed
// leader's late write would walk it backwards.
func (a *actor) adoptAssignment(val *assignmentVal) {
	if a.assignSeen && val.Generation < a.assignGen {
		a.log.Debug("ignoring an assignment from an older generation", "generation", val.Generation, "seen", a.assignGen)
		return
	}
	a.assignGen = val.Generation
	a.assignSeen = true
	next := make(map[string]bool, len(val.Splits))
	now := time.Now()
	for _, id := range val.Splits {
		next[id] = true
		if _, held := a.owned[id]; !held {
			if _, ok := a.awaiting[id]; !ok {
				a.awaiting[id] = now
			}
		}
	}
	for id := range a.awaiting {
		if !next[id] {
			delete(a.awaiting, id)
		}
	}
	a.assigned = next
}

func (a *actor) forgetAssignment() {
	a.assignSeen = false
	a.assigned = map[string]bool{}
	clear(a.awaiting)
}

// ----- leaving a tenancy --------------------------------------------------

// dropLost ends a tenancy involuntarily: it leaves the durable record and
// the lease alone, settles any revocation as forced and emits Lost.
func (a *actor) dropLost(id, reason, why string) {
	t, held := a.owned[id]
	if !held {
		return
	}
	delete(a.owned, id)
	if reason == "starved" && !a.forgiven[id] {
		// Once per split and process: a split that starves its worker again
		// and again may itself be the cause (a pathological input), and
		// then its attempts must count.
		a.selfFenced[id] = t.epoch
	}
	a.settle(id, "forced")
	a.m.losses.WithLabelValues(reason).Inc()
	a.log.Warn("split lost", "split", id, "reason", reason, "why", why)
	a.c.emit(Lost{Split: SplitID{id: id}})
}

// settle ends a revocation entry with an outcome. Cancelled entries already
// counted "cancelled" and count nothing more.
func (a *actor) settle(id, outcome string) {
	r, ok := a.revocations[id]
	if !ok {
		return
	}
	delete(a.revocations, id)
	if r.cancelled {
		return
	}
	a.m.revocations.WithLabelValues(outcome).Inc()
	if outcome == "drained" {
		a.m.drainDur.Observe(time.Since(r.started).Seconds())
		a.log.Debug("drain finished", "split", id, "took", time.Since(r.started))
	}
}

// deleteLease removes our lease key, guarded by its revision; best effort.
// A won delete clears the lease from the view at once, so the next claim
// scan does not mistake it for a live one.
func (a *actor) deleteLease(id string, rev uint64) {
	if rev == 0 {
		return
	}
	o, err := a.st.Delete(a.ctx, Ephemeral, prefixSplit+id, rev)
	if err != nil {
		a.log.Debug("lease delete failed; it will expire", "split", id, "err", err)
		return
	}
	if v := a.splits[id]; o.Won && v != nil && v.lease != nil && v.leaseRev == rev {
		v.lease = nil
		a.dirty = true
	}
}

// demote gives leadership up: a guarded delete of the leader key (best
// effort).
func (a *actor) demote(why string) {
	if a.leading == nil {
		return
	}
	rev := a.leading.rev
	a.log.Warn("leadership lost", "why", why)
	a.dropLeadership()
	if _, err := a.st.Delete(a.ctx, Ephemeral, keyLeader, rev); err != nil {
		a.log.Debug("leader key delete failed; it will expire", "err", err)
	}
}

func (a *actor) dropLeadership() {
	a.leading = nil
	a.m.leader.Set(0)
	a.planDue = false
	if a.planCancel != nil {
		a.planCancel()
	}
}
