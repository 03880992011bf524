package spate

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/fnv"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"
)

// renewConcurrency bounds the renewals one beat has in flight: N held
// splits renew in about N/renewConcurrency round trips, not N.
const renewConcurrency = 32

// renewer keeps this worker's ephemeral keys alive — its presence, the
// leader key while it leads, and the lease of every split it holds — on
// its own goroutine and schedule, talking to the store directly. Nothing
// the loop does (commits, claims, listings, watch re-establishment,
// planning) can queue in front of a renewal: the model is KCL's lease
// renewer and etcd's Session keep-alive beside a single state owner.
//
// The renewer decides nothing about the job. What it finds — a lease gone
// or taken, leadership fenced, a twin — it reports to the loop as notes.
type renewer struct {
	st         Store
	cfg        Config
	tm         timings
	log        *slog.Logger
	m          *coordMetrics
	self       string
	nonce      string
	jitterSeed uint64
	beatRound  uint64
	check      chan struct{} // one slot: check presence now

	sessioner Sessioner // nil: every lease is renewed by its own write

	mu          sync.Mutex
	leases      map[string]*leaseHold
	sess        *sessionHold // the session new leases bind to; nil: none open
	presRev     uint64       // our presence record's revision as last seen (0: re-create it)
	presWritten uint64       // the last presence revision this process wrote
	presOff     bool         // parted: presence is no longer renewed
	leader      *leaderHold

	notes *signalQueue[renewNote]
}

// leaseHold is one held split's lease as the renewer keeps it.
type leaseHold struct {
	epoch  uint64
	rev    uint64
	lastOK time.Time    // when the last write (or the session's keep-alive) that landed was sent
	sess   *sessionHold // the session the lease is bound to; nil: renewed by its own write
}

// sessionHold is the store session this worker binds its split leases to
// ([Sessioner]): one KeepAlive per beat renews them all, and a renewal
// writes no key, so no watcher receives it. A bound lease lives as long
// as the session: until a lease after its last keep-alive that landed.
type sessionHold struct {
	s      Session
	lastOK time.Time // when the last keep-alive (or NewSession) that landed was sent
}

type leaderHold struct {
	rev        uint64
	generation uint64
}

type noteKind uint8

const (
	noteLost   noteKind = iota + 1 // a held split's lease is gone or taken
	noteDemote                     // the leader key's renewal was fenced
	noteFatal                      // stop: a twin, an alien record
)

// renewNote is what the renewer tells the loop.
type renewNote struct {
	kind   noteKind
	id     string
	epoch  uint64
	reason string // a losses metric label
	why    string
	err    error
}

func newRenewer(st Store, cfg Config, log *slog.Logger, m *coordMetrics, self, nonce string, seed uint64) *renewer {
	r := &renewer{st: st, cfg: cfg, tm: deriveTimings(cfg), log: log, m: m, self: self, nonce: nonce, jitterSeed: seed,
		check: make(chan struct{}, 1), leases: map[string]*leaseHold{},
		notes: newSignalQueue[renewNote]()}
	r.sessioner, _ = SessionerOf(st)
	return r
}

// retrySoon waits retryWait after a Retryable renewal failure and reports
// whether to try once more (false for a Fatal error or when ctx ends).
func (r *renewer) retrySoon(ctx context.Context, err error) bool {
	if kindOf(err) != kindRetryable || ctx.Err() != nil {
		return false
	}
	t := time.NewTimer(r.tm.renewRetry)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// session returns the session a new lease binds to, or nil.
func (r *renewer) session() *sessionHold {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sess
}

// keepSession renews the session (or opens one when there is none), and
// extends every lease bound to it. A session that expired takes its
// leases with it: they are lost (self-fenced), and a new session is
// opened at the next beat.
func (r *renewer) keepSession(ctx context.Context) {
	if r.sessioner == nil {
		return
	}
	r.mu.Lock()
	sh := r.sess
	r.mu.Unlock()
	sent := time.Now()
	if sh == nil {
		s, err := r.sessioner.NewSession(ctx)
		if err != nil {
			r.log.Debug("opening a lease session failed; leases are renewed one by one meanwhile", "err", err)
			return
		}
		r.mu.Lock()
		r.sess = &sessionHold{s: s, lastOK: sent}
		r.mu.Unlock()
		return
	}
	err := sh.s.KeepAlive(ctx)
	if err != nil && r.retrySoon(ctx, err) {
		sent = time.Now()
		err = sh.s.KeepAlive(ctx)
	}
	switch {
	case err == nil:
		r.mu.Lock()
		sh.lastOK = sent
		for _, h := range r.leases {
			if h.sess == sh {
				h.lastOK = sent
			}
		}
		r.mu.Unlock()
	case errors.Is(err, ErrSessionExpired) || kindOf(err) == kindFatal:
		r.log.Warn("the lease session expired: its leases are gone", "err", err)
		var lost []renewNote
		r.mu.Lock()
		if r.sess == sh {
			r.sess = nil
		}
		for id, h := range r.leases {
			if h.sess == sh {
				delete(r.leases, id)
				lost = append(lost, renewNote{kind: noteLost, id: id, epoch: h.epoch, reason: "starved",
					why: "its lease session expired: no keep-alive reached the store for a whole lease"})
			}
		}
		r.mu.Unlock()
		_ = sh.s.Close()
		for _, n := range lost {
			r.notes.put(n)
		}
	default:
		r.log.Debug("lease session keep-alive failed; retrying next beat", "err", err)
	}
}

// endSession closes the lease session at a graceful shutdown, after the
// hand-back: the store deletes at once what is still bound to it (a lease
// the hand-back could not delete in its budget) and frees the session
// itself (on etcd, its lease and marker key), instead of a TTL later.
// The renewer has stopped; Abandon never calls this.
func (r *renewer) endSession() {
	r.mu.Lock()
	sh := r.sess
	r.sess = nil
	r.mu.Unlock()
	if sh == nil {
		return
	}
	if err := sh.s.Close(); err != nil {
		r.log.Debug("closing the lease session failed; it expires within a lease", "err", err)
	}
}

// beatInterval is a third of the lease scaled by a jitter in [0.8, 1.2)
// derived from this process's seed and the round, so workers drift apart
// instead of herding.
func (r *renewer) beatInterval() time.Duration {
	r.beatRound++
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], r.beatRound)
	h := fnv.New64a()
	h.Write(b[:])
	j := 0.8 + 0.4*float64(mix64(h.Sum64()^r.jitterSeed)>>11)/float64(1<<53)
	return time.Duration(float64(r.tm.beat) * j)
}

func (r *renewer) run(ctx context.Context) {
	t := time.NewTimer(r.beatInterval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.check:
			r.renewPresence(ctx)
		case <-t.C:
			r.beat(ctx)
			t.Reset(r.beatInterval())
		}
	}
}

// beat renews presence, leadership and every lease due, concurrently, then
// self-fences the tenancies no renewal reached the store for in a whole
// lease: such a split may already be another's.
func (r *renewer) beat(ctx context.Context) {
	now := time.Now()
	r.mu.Lock()
	type due struct {
		id string
		h  leaseHold
	}
	var leases []due
	for _, id := range slices.Sorted(maps.Keys(r.leases)) {
		if h := r.leases[id]; h.sess == nil && now.Sub(h.lastOK) >= r.tm.renewGate {
			leases = append(leases, due{id, *h})
		}
	}
	r.mu.Unlock()

	sem := make(chan struct{}, renewConcurrency)
	var wg sync.WaitGroup
	wg.Go(func() { r.renewPresence(ctx) })
	wg.Go(func() { r.renewLeader(ctx) })
	wg.Go(func() { r.keepSession(ctx) })
	for _, d := range leases {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			r.renewLease(ctx, d.id, d.h)
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	now = time.Now()
	r.mu.Lock()
	var starved []renewNote
	for _, id := range slices.Sorted(maps.Keys(r.leases)) {
		if h := r.leases[id]; now.Sub(h.lastOK) >= r.cfg.LeaseDuration {
			delete(r.leases, id)
			starved = append(starved, renewNote{kind: noteLost, id: id, epoch: h.epoch, reason: "starved",
				why: "self-fenced: no lease renewal reached the store for a whole lease"})
		}
	}
	r.mu.Unlock()
	for _, n := range starved {
		r.notes.put(n)
	}
}

func (r *renewer) renewLease(ctx context.Context, id string, h leaseHold) {
	key := prefixSplit + id
	lv := encode(leaseVal{Schema: SchemaVersion, Owner: r.self, Nonce: r.nonce, Epoch: h.epoch})
	rev := h.rev
	// At most two writes: the renewal, and once more after adopting a
	// renewal that landed though its reply was lost; and one more try,
	// a moment later, after a Retryable failure.
	retried := false
	for range 2 {
		sent := time.Now()
		o, err := r.st.Update(ctx, Ephemeral, key, lv, rev)
		if err != nil && !retried && r.retrySoon(ctx, err) {
			retried = true
			sent = time.Now()
			o, err = r.st.Update(ctx, Ephemeral, key, lv, rev)
		}
		if err != nil {
			r.log.Debug("lease renewal failed; retrying next beat", "split", id, "err", err)
			return
		}
		if o.Won {
			r.mu.Lock()
			if cur := r.leases[id]; cur != nil && cur.epoch == h.epoch && o.Revision > cur.rev {
				cur.rev, cur.lastOK = o.Revision, sent
			}
			r.mu.Unlock()
			return
		}
		r.m.writes.WithLabelValues("conflict").Inc()
		e, ok, err := r.st.Get(ctx, Ephemeral, key)
		if err != nil {
			return // undecided; next beat
		}
		if !ok {
			r.lose(id, h.epoch, "starved", "its lease expired before the renewal")
			return
		}
		l, err := decodeLease(key, e.Value)
		if err != nil {
			r.notes.put(renewNote{kind: noteFatal, err: err})
			return
		}
		switch {
		case l.Owner == r.self && l.Nonce == r.nonce && l.Epoch == h.epoch:
			// A previous renewal landed but its reply was lost: adopt its
			// revision (dropping would cost a delivery attempt for nothing)
			// and rewrite at once, since its TTL runs from that earlier write.
			rev = e.Revision
			r.mu.Lock()
			if cur := r.leases[id]; cur != nil && cur.epoch == h.epoch && rev > cur.rev {
				cur.rev = rev
			}
			r.mu.Unlock()
		case l.Owner == r.self && l.Nonce != r.nonce:
			r.lose(id, h.epoch, "fenced", "its lease was taken by another process with this instance id")
			r.checkPresence()
			return
		default:
			r.lose(id, h.epoch, "fenced", "its lease is held by "+l.Owner)
			return
		}
	}
}

// lose drops a lease the renewal found gone or taken and tells the loop,
// unless the loop stopped renewing it meanwhile (a release in flight
// deletes the lease itself; a renewal that started before it must not
// report that delete as a loss).
func (r *renewer) lose(id string, epoch uint64, reason, why string) {
	r.mu.Lock()
	h := r.leases[id]
	held := h != nil && h.epoch == epoch
	if held {
		delete(r.leases, id)
	}
	r.mu.Unlock()
	if held {
		r.notes.put(renewNote{kind: noteLost, id: id, epoch: epoch, reason: reason, why: why})
	}
}

func (r *renewer) renewLeader(ctx context.Context) {
	r.mu.Lock()
	h := r.leader
	r.mu.Unlock()
	if h == nil {
		return
	}
	val := encode(leaderVal{Schema: SchemaVersion, Owner: r.self, Nonce: r.nonce, Generation: h.generation})
	rev := h.rev
	for range 2 {
		o, err := r.st.Update(ctx, Ephemeral, keyLeader, val, rev)
		if err != nil {
			r.log.Debug("leader renewal failed; retrying next beat", "err", err)
			return
		}
		if o.Won {
			r.mu.Lock()
			if r.leader == h {
				h.rev = o.Revision
			}
			r.mu.Unlock()
			return
		}
		// Lost: unless the key still holds our own earlier renewal (its
		// reply lost: adopt it and rewrite), leadership is fenced.
		e, ok, err := r.st.Get(ctx, Ephemeral, keyLeader)
		if err != nil {
			return // undecided; next beat
		}
		if ok {
			if l, derr := decodeLeader(e.Value); derr == nil && l.Nonce == r.nonce && l.Generation == h.generation {
				rev = e.Revision
				continue
			}
		}
		break
	}
	r.mu.Lock()
	if r.leader == h {
		r.leader = nil
	}
	r.mu.Unlock()
	r.notes.put(renewNote{kind: noteDemote, why: "renewal fenced"})
}

// ----- what the loop tells the renewer ------------------------------------------

func (r *renewer) setLeader(rev, generation uint64) {
	r.mu.Lock()
	r.leader = &leaderHold{rev: rev, generation: generation}
	r.mu.Unlock()
}

// clearLeader stops renewing the leader key and returns its revision.
func (r *renewer) clearLeader() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.leader == nil {
		return 0
	}
	rev := r.leader.rev
	r.leader = nil
	return rev
}

func (r *renewer) leaderRev() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.leader == nil {
		return 0
	}
	return r.leader.rev
}

// hold starts renewing a split's lease, written at rev when sent, bound
// to session sess (nil: renewed by its own writes). A lease bound to a
// session lives as long as the session, so its clock is the session's.
func (r *renewer) hold(id string, epoch, rev uint64, sent time.Time, sess *sessionHold) {
	r.mu.Lock()
	if sess != nil {
		sent = sess.lastOK
	}
	r.leases[id] = &leaseHold{epoch: epoch, rev: rev, lastOK: sent, sess: sess}
	r.mu.Unlock()
}

// release stops renewing a split's lease and returns its last revision.
func (r *renewer) release(id string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.leases[id]
	if h == nil {
		return 0
	}
	delete(r.leases, id)
	return h.rev
}

// take stops renewing a split's lease, like release, and returns what
// the renewer held for it, so that a release that fails may hand it back
// ([renewer.hold]).
func (r *renewer) take(id string) (leaseHold, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.leases[id]
	if h == nil {
		return leaseHold{}, false
	}
	delete(r.leases, id)
	return *h, true
}

func (r *renewer) leaseRev(id string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if h := r.leases[id]; h != nil {
		return h.rev
	}
	return 0
}

// ----- on the loop ---------------------------------------------------------------

// onRenewNotes folds what the renewer found.
func (a *actor) onRenewNotes(notes []renewNote) error {
	for _, n := range notes {
		switch n.kind {
		case noteFatal:
			return n.err
		case noteDemote:
			if a.leader.term != nil {
				a.demote(n.why)
			}
		case noteLost:
			if t, held := a.worker.owned[n.id]; held && t.epoch == n.epoch {
				a.dropLost(n.id, n.reason, n.why)
			}
		}
	}
	return nil
}
