package spate

import (
	"hash/fnv"
	"log/slog"
)

// env is what the actor's store calls need and what never changes once
// the actor is built: the store and its optional capabilities, this
// worker's identity in the job, the job's fingerprint, the renewer (safe
// for concurrent use), metrics and the log.
//
// The actor embeds it, so the loop reads a.st and a.self as before. The
// store calls that run beside the loop and have a name of their own
// (claimIO with writeLease and writeClaim, commitIO, runElection,
// writeAssignments, the startup probe and announce) are methods of env
// rather than of the actor: the compiler then keeps them off the loop's
// state, which only the loop goroutine may touch.
type env struct {
	st     Store
	rel    Releaser   // st's Releaser capability; nil: a release is two calls
	kw     KeyWatcher // st's KeyWatcher capability; nil: every worker watches the whole job
	renew  *renewer   // the renewer beside the loop (lease.go)
	log    *slog.Logger
	m      *coordMetrics
	self   string // this worker's instance id
	nonce  string // this process's nonce: two processes with one id differ in it
	fp     string // the job's fingerprint
	fpHash uint64
}

// newEnv builds the actor's env for coordinator c and the job's
// fingerprint fp.
func newEnv(c *StoreCoordinator, fp string) env {
	h := fnv.New64a()
	h.Write([]byte(c.cfg.InstanceID + "/" + c.nonce))
	e := env{st: c.store, log: c.log, m: c.m, self: c.cfg.InstanceID, nonce: c.nonce, fp: fp, fpHash: fingerprintHash(fp)}
	e.renew = newRenewer(c.store, c.cfg, c.log, c.m, e.self, e.nonce, h.Sum64())
	e.rel, _ = ReleaserOf(c.store)
	e.kw, _ = KeyWatcherOf(c.store)
	return e
}
