package spate

import (
	"log/slog"
	"maps"
	"slices"
	"time"
)

// membership is the fleet as this worker sees it, folded from the
// presence records (and only here): the live members and their lane
// budgets, the departed members' rebalance-delay windows, and what the
// fleet's log line has announced.
type membership struct {
	presence map[string]presenceEntry
	caps     map[string]int
	// departed is the members whose presence went, since when: their
	// splits wait out the rebalance delay before they are reassigned.
	departed    map[string]time.Time
	loggedPeers map[string]bool
	joinLogged  bool
	// dirty: the presence set changed since the last membership log.
	dirty bool
}

func newMembership() membership {
	return membership{presence: map[string]presenceEntry{}, caps: map[string]int{},
		departed: map[string]time.Time{}, loggedPeers: map[string]bool{}}
}

type presenceEntry struct {
	rev      uint64
	at       uint64
	unproven bool // not yet seen renewing (a later revision than first seen); never self
}

// presencePut folds a put of a member's presence record at rev.
func (a *actor) presencePut(key string, value []byte, rev uint64) {
	m := &a.members
	inst := key[len(prefixWorker):]
	old, known := m.presence[inst]
	if known && rev <= old.rev {
		return
	}
	if !known {
		a.dirty = true
		m.dirty = true
		if l := a.leader.term; l != nil {
			l.memberArrived(time.Now(), a.c.tm.settleQuiet)
		}
	}
	// A member is proven once this worker has seen it renew (or it is
	// this worker): a record first seen may belong to a dead process.
	unproven := !known && inst != a.self
	if known && old.unproven {
		a.dirty = true // it may now be given a share of held splits
	}
	m.presence[inst] = presenceEntry{rev: rev, at: a.job.clock, unproven: unproven}
	if _, ok := m.departed[inst]; ok {
		delete(m.departed, inst) // a returning instance cancels its window
		a.dirty = true
	}
	w, err := decodeWorker(key, value)
	if err != nil {
		a.log.Warn("unreadable presence record; the member keeps the default lane budget", "key", key, "err", err)
	} else if w.MaxInFlight > 0 && m.caps[inst] != w.MaxInFlight {
		m.caps[inst] = w.MaxInFlight
		a.dirty = true
	}
	if inst == a.self && w != nil && w.Nonce != a.nonce {
		a.renew.checkPresence() // a twin, or our predecessor's record
	}
}

// presenceDelete folds a delete of member inst's presence record at rev
// (or, with force, its authoritative absence from a read).
func (a *actor) presenceDelete(inst string, rev uint64, force bool) {
	m := &a.members
	old, ok := m.presence[inst]
	if !ok || !force && rev <= old.rev {
		return
	}
	delete(m.presence, inst)
	delete(m.caps, inst)
	a.dirty = true
	m.dirty = true
	switch {
	case inst != a.self && isGeneratedID(inst):
		// Its id was generated: no process can come back under it, so
		// its splits are free at once, not after the rebalance delay.
		a.log.Info("a worker departed; its id was generated, so its splits are reassigned without the rebalance delay", "peer", inst)
	case inst != a.self:
		m.departed[inst] = time.Now()
	case !a.worker.parting:
		a.renew.presenceGone(rev)
	}
}

// presenceSweep applies a complete read of the ephemeral keyspace that
// started at mark: a member seen before mark that the read does not
// list is gone.
func (a *actor) presenceSweep(listed map[string]bool, mark uint64) {
	for _, inst := range slices.Sorted(maps.Keys(a.members.presence)) {
		if !listed[prefixWorker+inst] {
			a.presenceAbsent(inst, mark)
		}
	}
}

// presenceAbsent applies the absence of member inst's presence record
// from a complete read that started at mark.
func (a *actor) presenceAbsent(inst string, mark uint64) {
	if e, ok := a.members.presence[inst]; ok && e.at < mark {
		a.presenceDelete(inst, 0, true)
	}
}

// forgetPeers forgets every member but self: a scoped worker watches
// only its own keys, so what it held of the others goes stale.
func (m *membership) forgetPeers(self string) {
	for inst := range m.presence {
		if inst != self {
			delete(m.presence, inst)
			delete(m.caps, inst)
		}
	}
	clear(m.departed)
}

// joined logs this worker's joining, once its first watches are in:
// the peers already present are announced as part of it, not one by one.
func (m *membership) joined(log *slog.Logger, self string, plan *planRecord) {
	peers := slices.Sorted(maps.Keys(m.presence))
	peers = slices.DeleteFunc(peers, func(p string) bool { return p == self })
	for _, p := range peers {
		m.loggedPeers[p] = true
	}
	m.loggedPeers[self] = true
	if len(peers) > 0 {
		log.Info("joined a fleet already running", "peers", peers)
	} else {
		log.Info("joined the job", "generation", plan.Generation)
	}
	m.joinLogged = true
	m.dirty = true
}

// inferDeparted starts a rebalance-delay window, at now, for every owner
// of a split record in splits that has no presence and no window yet: a
// leader that did not watch the members before it was elected (it
// watched only its own keys, or it just started) never saw them leave,
// and without a window would hand a departed worker's splits on at once.
func (m *membership) inferDeparted(splits map[string]*splitView, now time.Time, delay time.Duration, log *slog.Logger) {
	if delay == NoRebalanceDelay {
		return
	}
	for _, v := range splits {
		if v.prog == nil {
			continue
		}
		inst := v.prog.owner()
		if inst == "" {
			continue
		}
		if _, present := m.presence[inst]; present {
			continue
		}
		if isGeneratedID(inst) {
			continue // a generated id never comes back: no delay
		}
		if _, waiting := m.departed[inst]; !waiting {
			m.departed[inst] = now
			log.Info("a split's owner is not present: its splits wait out the rebalance delay", "peer", inst, "delay", delay)
		}
	}
}

// expireDeparted ends the rebalance-delay windows that are over at now and
// reports whether any did (on every worker: leadership can move).
func expireDeparted(departed map[string]time.Time, delay time.Duration, now time.Time) bool {
	changed := false
	for inst, at := range departed {
		if delay == NoRebalanceDelay || now.Sub(at) >= delay {
			delete(departed, inst)
			changed = true
		}
	}
	return changed
}

// logMembership announces peers joining and leaving, diffed from the
// presence set so a re-snapshot does not re-announce everyone.
func (j *membership) logMembership(log *slog.Logger, self string) {
	if !j.joinLogged || !j.dirty {
		return
	}
	j.dirty = false
	for inst := range j.presence {
		if !j.loggedPeers[inst] {
			j.loggedPeers[inst] = true
			log.Info("peer joined", "peer", inst, "live", len(j.presence))
		}
	}
	for inst := range j.loggedPeers {
		if _, ok := j.presence[inst]; !ok && inst != self {
			delete(j.loggedPeers, inst)
			log.Info("peer left", "peer", inst, "live", len(j.presence))
		}
	}
}
