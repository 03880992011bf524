package spate

import (
	"log/slog"
	"time"
)

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
func (j *jobView) logMembership(log *slog.Logger, self string) {
	if !j.joinLogged || !j.membersDirty {
		return
	}
	j.membersDirty = false
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
