package spate

import "time"

// Membership: the rebalance-delay windows of departed members, and the
// log line of the fleet's changes.

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
func (a *actor) logMembership() {
	if !a.job.joinLogged || !a.job.membersDirty {
		return
	}
	a.job.membersDirty = false
	for inst := range a.job.presence {
		if !a.job.loggedPeers[inst] {
			a.job.loggedPeers[inst] = true
			a.log.Info("peer joined", "peer", inst, "live", len(a.job.presence))
		}
	}
	for inst := range a.job.loggedPeers {
		if _, ok := a.job.presence[inst]; !ok && inst != a.self {
			delete(a.job.loggedPeers, inst)
			a.log.Info("peer left", "peer", inst, "live", len(a.job.presence))
		}
	}
}
