package spate

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Scoped watching. On a store with the [KeyWatcher] capability a worker
// that does not lead watches only the keys that concern it: the leader
// key, its own presence, the plan, its own assignment, the verdict, and
// the lease, progress record and spec of each split it is assigned or
// holds. The leader watches the whole job (it assigns and judges it). So a
// write reaches the leader and the split's holder, not every worker, and
// a non-leader's work, memory and re-reads after a watch break grow with
// its own splits (docs/coordinator.md, "Scale").
//
// The keys are watched in groups, each one WatchKeys call: a group is
// opened for the keys the scope gained, and keys it lost are dropped from
// the view at once (their later events are ignored); when the dropped keys
// outnumber the watched ones, every group is replaced by fresh ones.

// keyScope is the scoped mode's key groups and the keys they cover.
type keyScope struct {
	groups  map[*keyGroup]struct{}
	covered [2]map[string]int // keys watched by the key groups, per keyspace, with how many groups
	loaded  [2]map[string]int // of those, keys whose group's snapshot is in, with how many groups
}

func newKeyScope() keyScope {
	return keyScope{groups: map[*keyGroup]struct{}{}, covered: [2]map[string]int{{}, {}}, loaded: [2]map[string]int{{}, {}}}
}

// keyGroup is one key watch of the scoped mode.
type keyGroup struct {
	ks         Keyspace
	keys       []string
	cancel     context.CancelFunc // ends the stream; nil while being established
	collecting bool               // between establishment and SnapshotDone
	loaded     bool               // its snapshot is folded into the view
	closed     bool
	since      uint64
	deadline   time.Time
	snapshot   []Entry
}

// keyEvent is one item of a key group's stream, handed to the loop.
type keyEvent struct {
	g  *keyGroup
	ev WatchEvent
	ok bool
}

// keyVerdict is the durable key of the leader's terminal verdict.
const keyVerdict = "verdict"

// groupIDs caps the splits one group watches: three durable or two
// ephemeral keys each, within MaxWatchKeys.
const groupIDs = MaxWatchKeys / 4

// wantWholeJob reports whether this worker watches the whole job: on a
// store without KeyWatcher, and on the leader.
func (a *actor) wantWholeJob() bool { return a.kw == nil || a.leader.term != nil }

// splitOfKey returns the split a split or spec key names.
func splitOfKey(key string) (string, bool) {
	if id, ok := strings.CutPrefix(key, prefixSplit); ok {
		return id, true
	}
	return strings.CutPrefix(key, prefixSpec)
}

// baseKeys are the keys every scoped worker watches in ks.
func baseKeys(ks Keyspace, self string) []string {
	if ks == Ephemeral {
		return []string{keyLeader, prefixWorker + self}
	}
	return []string{keyPlan, prefixAssign + self, keyVerdict}
}

// splitKeys are the keys of split id watched in ks.
func splitKeys(ks Keyspace, id string) []string {
	if ks == Ephemeral {
		return []string{prefixSplit + id}
	}
	return []string{prefixSplit + id, prefixSpec + id}
}

// syncWatchMode moves between whole-job and scoped watching as leadership
// comes and goes, and keeps the scoped key groups in step with the scope.
func (a *actor) syncWatchMode() {
	if a.kw == nil {
		return
	}
	if a.wantWholeJob() {
		for _, w := range a.w.streams {
			if w.ch == nil && !w.opening && !a.w.rewatchPending {
				a.openWatch(w)
			}
		}
		if a.w.fullView && len(a.w.groups) > 0 {
			// The whole-job watches cover every key now.
			a.w.closeGroups()
		}
		return
	}
	if a.w.fullView || a.w.streams[0].ch != nil || a.w.streams[1].ch != nil {
		a.w.closeStreams()
		a.prune()
		a.w.scopeDirty = true
	}
	if a.w.scopeDirty {
		a.rescope()
	}
}

// prune drops from the view what a scoped worker does not watch: other
// splits, other members, other assignments and the leader's bookkeeping.
func (a *actor) prune() {
	a.job.keepOnly(func(id string) bool { return a.worker.inScope(id) || a.io.busy[id] })
	a.members.forgetPeers(a.self)
	a.assigns.forgetPeers(a.self)
	damaged := a.records.keepOnly(a.worker.inScope)
	a.leader.pub.forgetMoves()
	a.m.damaged.Set(float64(damaged))
}

// rescope opens groups for the keys the scope gained and forgets the
// splits it lost.
func (a *actor) rescope() {
	a.w.scopeDirty = false
	ids := map[string]bool{}
	for id := range a.worker.assigned {
		ids[id] = true
	}
	for id := range a.worker.owned {
		ids[id] = true
	}
	for id := range a.worker.handingBack {
		ids[id] = true
	}
	// Splits that left the scope leave the view.
	a.job.keepOnly(func(id string) bool { return ids[id] || a.io.busy[id] })
	watched, stale := 0, 0
	for _, ks := range keyspaces {
		for key, n := range a.w.covered[ks-1] {
			if id, ok := splitOfKey(key); ok && !ids[id] {
				stale += n
			} else {
				watched++
			}
		}
	}
	if stale > watched+64 {
		a.w.closeGroups() // mostly dropped keys: start afresh
	}
	for _, ks := range keyspaces {
		cov := a.w.covered[ks-1]
		var missing []string
		for _, k := range baseKeys(ks, a.self) {
			if cov[k] == 0 {
				missing = append(missing, k)
			}
		}
		for _, id := range slices.Sorted(maps.Keys(ids)) {
			for _, k := range splitKeys(ks, id) {
				if cov[k] == 0 {
					missing = append(missing, k)
				}
			}
		}
		for chunk := range slices.Chunk(missing, groupIDs) {
			a.openGroup(ks, chunk)
		}
	}
}

// keyspaces are the two keyspaces, in watch order.
var keyspaces = [2]Keyspace{Ephemeral, Durable}

// openGroup establishes a key watch beside the loop.
func (a *actor) openGroup(ks Keyspace, keys []string) {
	g := &keyGroup{ks: ks, keys: keys}
	a.w.groups[g] = struct{}{}
	for _, k := range keys {
		a.w.covered[ks-1][k]++
	}
	since := a.job.mark()
	a.spawn(func(ctx context.Context) func() error {
		gctx, cancel := context.WithCancel(ctx)
		ch, err := a.kw.WatchKeys(gctx, ks, keys)
		return func() error {
			if err != nil || g.closed {
				cancel()
				if err == nil {
					return nil
				}
				a.w.dropGroup(g)
				if kindOf(err) == kindFatal {
					return fmt.Errorf("watch %d %s keys: %w", len(keys), ks, err)
				}
				a.w.failLog.fail(a.log, "key watch failed; retrying", "keyspace", ks, "keys", len(keys), "err", err)
				a.w.rewatchSoon()
				return nil
			}
			a.startGroup(g, gctx, ch, cancel, since)
			a.w.failLog.ok(a.log)
			return nil
		}
	})
}

// startGroup makes an established group's stream an input of the loop.
func (a *actor) startGroup(g *keyGroup, ctx context.Context, ch <-chan WatchEvent, cancel context.CancelFunc, since uint64) {
	g.cancel, g.collecting, g.since = cancel, true, since
	g.deadline = time.Now().Add(a.c.tm.snapshotBudget)
	a.io.goBeside(func() {
		for {
			ev, ok := <-ch
			select {
			case a.w.keyEvents <- keyEvent{g: g, ev: ev, ok: ok}:
			case <-ctx.Done():
				for range ch {
				}
				return
			}
			if !ok {
				return
			}
		}
	})
}

// dropGroup ends a group: its keys are no longer covered by it.
func (ws *watchSet) dropGroup(g *keyGroup) {
	if g.closed {
		return
	}
	g.closed = true
	if g.cancel != nil {
		g.cancel()
	}
	delete(ws.groups, g)
	cov, ld := ws.covered[g.ks-1], ws.loaded[g.ks-1]
	for _, k := range g.keys {
		if cov[k]--; cov[k] <= 0 {
			delete(cov, k)
		}
		if g.loaded {
			if ld[k]--; ld[k] <= 0 {
				delete(ld, k)
			}
		}
	}
}

// markLoaded notes that g's snapshot is in the view.
func (ws *watchSet) markLoaded(g *keyGroup) {
	g.loaded = true
	for _, k := range g.keys {
		ws.loaded[g.ks-1][k]++
	}
}

// viewLoaded reports whether the view holds split id as the store has it:
// on a scoped worker, once the snapshots of the groups watching its lease
// and its progress record are in. Until then its lease may look absent
// while another worker still holds it, and a claim would lose. (A worker
// whose store has no key watches is never scoped: fullView is set from
// the start.)
func (ws *watchSet) viewLoaded(id string) bool {
	if ws.fullView {
		return true
	}
	k := prefixSplit + id
	return ws.loaded[Ephemeral-1][k] > 0 && ws.loaded[Durable-1][k] > 0
}

// closeGroups ends every key group.
func (ws *watchSet) closeGroups() {
	for g := range ws.groups {
		ws.dropGroup(g)
	}
}

// onKeyEvent handles one item of a key group's stream.
func (a *actor) onKeyEvent(ke keyEvent) error {
	g, ev := ke.g, ke.ev
	if g.closed {
		return nil // a group replaced or dropped: its late events are moot
	}
	if !ke.ok || ev.Kind == WatchError {
		if ke.ok {
			a.log.Warn("key watch broke; re-watching", "keyspace", g.ks, "keys", len(g.keys), "err", ev.Err)
		} else {
			a.log.Warn("key watch ended; re-watching", "keyspace", g.ks, "keys", len(g.keys))
		}
		a.w.dropGroup(g)
		if ke.ok && kindOf(ev.Err) == kindFatal {
			return fmt.Errorf("watch %s keys: %w", g.ks, ev.Err)
		}
		a.w.rewatchSoon()
		return nil
	}
	if g.collecting {
		switch ev.Kind {
		case WatchPut:
			g.snapshot = append(g.snapshot, Entry{Key: ev.Key, Value: ev.Value, Revision: ev.Revision})
		case WatchSnapshotDone:
			snap := g.snapshot
			g.collecting, g.snapshot = false, nil
			a.worker.ownDirty = true
			a.w.markLoaded(g)
			return a.applyKeys(g.ks, g.keys, snap, g.since)
		}
		return nil
	}
	if id, ok := splitOfKey(ev.Key); ok && !a.worker.inScope(id) && !a.wantWholeJob() {
		return nil // a split that left the scope
	}
	return a.applyLive(g.ks, ev)
}

// applyKeys folds a complete read of the listed keys of ks that started at
// mark: a listed key the view holds from before mark that the read lacks
// is gone.
func (a *actor) applyKeys(ks Keyspace, keys []string, entries []Entry, mark uint64) error {
	listed := make(map[string]bool, len(entries))
	for _, e := range entries {
		listed[e.Key] = true
	}
	for _, k := range keys {
		if listed[k] {
			continue
		}
		if err := a.absent(ks, k, mark); err != nil {
			return err
		}
	}
	for _, e := range entries {
		if id, ok := splitOfKey(e.Key); ok && !a.worker.inScope(id) && !a.wantWholeJob() {
			continue
		}
		var err error
		if ks == Ephemeral {
			err = a.ephemeralPut(e.Key, e.Value, e.Revision)
		} else {
			err = a.durablePut(e.Key, e.Value, e.Revision, readSince(mark))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// absent applies the absence of key from a complete read of it that
// started at mark.
func (a *actor) absent(ks Keyspace, key string, mark uint64) error {
	if ks == Ephemeral {
		switch {
		case key == keyLeader:
			a.leaderKeyAbsent(mark)
		case strings.HasPrefix(key, prefixWorker):
			a.presenceAbsent(key[len(prefixWorker):], mark)
		case strings.HasPrefix(key, prefixSplit):
			a.leaseAbsent(key[len(prefixSplit):], mark)
		}
		return nil
	}
	if a.records.damagedBefore(key, mark) {
		a.repair(key, true)
		return nil
	}
	switch {
	case key == keyPlan:
		if a.planning.plan != nil && a.planning.planAt < mark {
			return errNamespaceGone("a read of this worker's keys has no plan record")
		}
	case key == keyVerdict:
		if a.verdicts.record != nil && a.verdicts.recordAt < mark {
			a.onVerdict(nil)
		}
	case strings.HasPrefix(key, prefixAssign):
		if a.assignAbsent(key[len(prefixAssign):], mark) {
			a.forgetAssignment()
		}
	case strings.HasPrefix(key, prefixSplit):
		id := key[len(prefixSplit):]
		if v := a.job.splits[id]; v != nil && v.prog != nil && v.progAt < mark {
			a.log.Warn("a split's progress record is missing from a read; the leader restores it from the last state seen", "split", id)
			a.forgetProgress(id, 0)
		}
	}
	return nil
}

// refreshScope is the scoped worker's listing backstop: every key group is
// replaced by a fresh one, whose snapshot re-reads this worker's keys (and
// only those).
func (ws *watchSet) refreshScope() {
	ws.closeGroups()
	ws.scopeDirty = true
}

// syncGroups establishes the base key groups at startup and applies their
// snapshots before the loop starts, as watchAll does for the whole job.
func (a *actor) syncGroups(ctx context.Context) error {
	for _, ks := range keyspaces {
		keys := baseKeys(ks, a.self)
		if a.w.covered[ks-1][keys[0]] > 0 {
			continue
		}
		gctx, cancel := context.WithCancel(ctx)
		ch, err := a.kw.WatchKeys(gctx, ks, keys)
		if err != nil {
			cancel()
			return fmt.Errorf("watch %s keys: %w", ks, err)
		}
		since := a.job.mark()
		var snap []Entry
		deadline := time.NewTimer(a.c.tm.snapshotBudget)
	collect:
		for {
			select {
			case ev, ok := <-ch:
				switch {
				case !ok || ev.Kind == WatchError:
					cancel()
					deadline.Stop()
					if ok && kindOf(ev.Err) == kindFatal {
						return fmt.Errorf("watch %s keys: %w", ks, ev.Err)
					}
					return Retryablef("watch %s keys: the stream broke during its snapshot", ks)
				case ev.Kind == WatchPut:
					snap = append(snap, Entry{Key: ev.Key, Value: ev.Value, Revision: ev.Revision})
				case ev.Kind == WatchSnapshotDone:
					break collect
				}
			case <-deadline.C:
				cancel()
				return Retryablef("watch %s keys: snapshot not complete within %v", ks, a.c.tm.snapshotBudget)
			case <-ctx.Done():
				cancel()
				deadline.Stop()
				return ctx.Err()
			}
		}
		deadline.Stop()
		if err := a.applyKeys(ks, keys, snap, since); err != nil {
			cancel()
			return err
		}
		g := &keyGroup{ks: ks, keys: keys}
		a.w.groups[g] = struct{}{}
		for _, k := range keys {
			a.w.covered[ks-1][k]++
		}
		a.startGroup(g, gctx, ch, cancel, since)
		g.collecting = false
		a.w.markLoaded(g)
	}
	return nil
}
