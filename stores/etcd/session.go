package etcd

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/spate-go/spate"
)

// sessionTag is where each session's marker key lives under
// Options.Prefix, outside both keyspaces.
const sessionTag = "session/"

var _ spate.Sessioner = (*store)(nil)

// NewSession implements [spate.Sessioner] (the driver's half; the
// [driver.PortableStore] wraps it): one lease granted with the store's TTL
// and a marker key attached to it. The marker keeps the lease from ever
// carrying no key, so the background revocation of superseded leases
// (which revokes a lease only once nothing is attached to it) never takes
// a session whose last bound key was rewritten or deleted.
func (s *store) NewSession(ctx context.Context) (spate.Session, error) {
	if err := s.live(); err != nil {
		return nil, err
	}
	g, err := s.cli.Grant(ctx, s.ttlSec)
	if err != nil {
		return nil, fmt.Errorf("grant the session's lease: %w", s.classify(ctx, err))
	}
	marker := fmt.Sprintf("%s%s%016x", s.prefix, sessionTag, int64(g.ID))
	if _, err := s.cli.Put(ctx, marker, "", clientv3.WithLease(g.ID)); err != nil {
		s.revokeLost(g.ID)
		return nil, fmt.Errorf("attach the session's marker: %w", s.classify(ctx, err))
	}
	return &session{s: s, id: g.ID}, nil
}

// session is one etcd lease that bound keys are attached to.
type session struct {
	s  *store
	id clientv3.LeaseID
}

// expired reports err as the session's expiry when etcd no longer knows
// its lease.
func (se *session) expired(ctx context.Context, err error) error {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("lease %x: %w: %w: %w", int64(se.id), err, spate.ErrSessionExpired, spate.ErrFatal)
	}
	return se.s.classify(ctx, err)
}

// Create implements [spate.Session]: the driver's create transaction,
// the key put on the session's lease.
func (se *session) Create(ctx context.Context, key string, value []byte) (spate.Outcome, error) {
	if err := se.s.live(); err != nil {
		return spate.Outcome{}, err
	}
	full := se.s.key(spate.Ephemeral, key)
	return se.put(ctx, full, value, clientv3.Compare(clientv3.CreateRevision(full), "=", 0))
}

// Update implements [spate.Session]: the driver's compare-and-swap
// transaction, the key moved onto the session's lease; the key's previous
// lease, if it was a write's own, is revoked in the background.
func (se *session) Update(ctx context.Context, key string, value []byte, expected uint64) (spate.Outcome, error) {
	if err := se.s.live(); err != nil {
		return spate.Outcome{}, err
	}
	rev, ok := revision(expected)
	if !ok {
		return spate.Outcome{}, nil
	}
	full := se.s.key(spate.Ephemeral, key)
	return se.put(ctx, full, value, clientv3.Compare(clientv3.ModRevision(full), "=", rev))
}

func (se *session) put(ctx context.Context, full string, value []byte, cond clientv3.Cmp) (spate.Outcome, error) {
	resp, err := se.s.cli.Txn(ctx).If(cond).
		Then(clientv3.OpPut(full, string(value), clientv3.WithLease(se.id), clientv3.WithPrevKV())).
		Commit()
	if err != nil {
		return spate.Outcome{}, se.expired(ctx, err)
	}
	if !resp.Succeeded {
		return spate.Outcome{}, nil
	}
	if pr := resp.Responses[0].GetResponsePut(); pr != nil && pr.PrevKv != nil {
		if prev := clientv3.LeaseID(pr.PrevKv.Lease); prev != se.id {
			se.s.supersede(prev)
		}
	}
	return spate.Won(uint64(resp.Header.Revision)), nil
}

// KeepAlive implements [spate.Session]: one LeaseKeepAlive round trip.
// The leader resets the lease to its full TTL when the request reaches
// it, after the call began, so the bound keys live at least one TTL from
// the call; it writes no key and proposes nothing to raft. A lease the
// server no longer has (expired, or revoked) is ErrSessionExpired.
func (se *session) KeepAlive(ctx context.Context) error {
	if err := se.s.live(); err != nil {
		return err
	}
	if _, err := se.s.cli.KeepAliveOnce(ctx, se.id); err != nil {
		return se.expired(ctx, err)
	}
	return nil
}

// Close implements [spate.Session]: it revokes the lease, which deletes
// every key attached to it (and the marker) in one raft proposal, each
// delete reaching watchers. It runs on a context of its own, bounded by
// DefaultRevokeTimeout; if the revocation fails the keys expire within
// one TTL, and Close says so with a Retryable error.
func (se *session) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultRevokeTimeout)
	defer cancel()
	if _, err := se.s.cli.Revoke(ctx, se.id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("revoke the session's lease (its keys expire within one TTL): %w", se.s.classify(ctx, err))
	}
	return nil
}
