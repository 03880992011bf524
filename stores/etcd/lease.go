package etcd

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Lease lifecycle. Every ephemeral write is granted a fresh lease of TTL
// seconds and attached to it in the same transaction, so the write re-arms
// the key's TTL atomically with its compare-and-swap (etcd has no way to
// refresh a lease inside a transaction, and refreshing one outside would
// extend a key the caller no longer owns). A lease therefore carries exactly
// one key, and no lease outlives its purpose for long:
//
//   - the write lost its condition: the lease is revoked at once,
//     synchronously, before the call returns;
//   - the write failed with an error: the lease stays, because the write may
//     have landed on it; unused, it expires within one TTL;
//   - the write won over an older version of the key, or a delete removed
//     the key: the key's previous lease now carries nothing and is revoked in
//     the background (best effort; one goroutine per store, a queue of
//     1024), after a TimeToLive read confirms that no key is attached to
//     it any more (a session's lease always carries its marker key, so a
//     rewrite or delete of a key bound to a session never revokes the
//     session). If that fails or the queue is full it expires within one
//     TTL.
//
// So at any time the store holds about one lease per live ephemeral key
// plus those of the last TTL's failed writes. Each ephemeral write costs two
// raft proposals (grant, transaction) and a third later (revocation, after
// one lease read). Sessions (session.go) are the exception: one lease
// carries every key bound to the session.

// revokeLost revokes the lease of a write that lost its condition. The
// caller's context may be done, so cleanup uses a fresh bounded one.
func (s *store) revokeLost(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultRevokeTimeout)
	defer cancel()
	s.revoke(ctx, id)
}

// supersede queues the lease of a key that was rewritten or deleted.
func (s *store) supersede(id clientv3.LeaseID) {
	if id == clientv3.NoLease {
		return
	}
	select {
	case s.reap <- id:
	default:
		s.log.Debug("etcd: lease revocation queue full; the lease expires on its own", "lease", int64(id))
	}
}

func (s *store) reaper() {
	for {
		select {
		case <-s.ctx.Done():
			return
		case id := <-s.reap:
			ctx, cancel := context.WithTimeout(s.ctx, DefaultRevokeTimeout)
			if s.unused(ctx, id) {
				s.revoke(ctx, id)
			}
			cancel()
			if s.reapHook != nil {
				s.reapHook(id)
			}
		}
	}
}

// unused reports whether a superseded lease carries no key any more: a
// write's own lease, whose one key moved off it. A session's lease always
// carries its marker key (and maybe other bound keys), so it is never
// revoked here, whoever rewrote or deleted one of its keys. If the lease
// cannot be read, it is left to expire.
func (s *store) unused(ctx context.Context, id clientv3.LeaseID) bool {
	ttl, err := s.cli.TimeToLive(ctx, id, clientv3.WithAttachedKeys())
	if err != nil {
		return false
	}
	return ttl.TTL > 0 && len(ttl.Keys) == 0
}

func (s *store) revoke(ctx context.Context, id clientv3.LeaseID) {
	_, err := s.cli.Revoke(ctx, id)
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) && s.ctx.Err() == nil {
		s.log.Debug("etcd: could not revoke an unused lease; it expires on its own within one TTL",
			"lease", int64(id), "err", err)
	}
}
