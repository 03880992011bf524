package spate

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

func (a *actor) startup(ctx context.Context) error {
	phases := []struct {
		name string
		f    func(context.Context) error
	}{
		{"store probe (durable)", func(ctx context.Context) error { return a.probe(ctx, Durable) }},
		{"store probe (ephemeral)", func(ctx context.Context) error { return a.probe(ctx, Ephemeral) }},
		{"join", a.join},
		{"announce presence", a.announce},
		// Before the first claim, so that every lease binds to it; a store
		// that cannot open one now gets its leases renewed one by one until
		// a beat opens it.
		{"lease session", func(ctx context.Context) error { a.renew.keepSession(ctx); return nil }},
		{"watch", a.watchAll},
	}
	for _, p := range phases {
		if err := budgeted(ctx, a.log, a.cfg.StartupMaxAttempts, p.name, p.f); err != nil {
			return err
		}
	}
	a.members.joined(a.log, a.self, a.planning.plan)
	return nil
}

// budgeted retries a Retryable startup phase with backoff from 200ms,
// doubling, capped at 5s, at most maxAttempts times (the
// StartupMaxAttempts setting).
func budgeted(ctx context.Context, log *slog.Logger, maxAttempts int, name string, f func(context.Context) error) error {
	backoff := 200 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := f(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if kindOf(err) != kindRetryable {
			return err
		}
		if attempt >= maxAttempts {
			return Fatalf("startup: %s failed %d times, giving up: %w", name, attempt, err)
		}
		log.Warn("startup phase failed; retrying", "phase", name, "attempt", attempt, "err", err)
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
func (e *env) probe(ctx context.Context, ks Keyspace) error {
	// The nonce keeps two processes that share an instance id (twins, found
	// later and named as such) from tripping over each other's probe.
	key := prefixProbe + e.self + "." + e.nonce
	v := []byte(e.nonce)
	o, err := e.st.Create(ctx, ks, key, v)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if !o.Won {
		_, _ = e.st.Delete(ctx, ks, key, AnyRevision)
		return Retryablef("probe: a crashed predecessor left %s key %q; cleared it", ks, key)
	}
	bad := func(format string, args ...any) error {
		return Fatalf("store probe (%s keyspace of the %s store): "+format+"; fencing cannot be trusted to it",
			append([]any{ks, e.st.Capabilities().Driver}, args...)...)
	}
	o2, err := e.st.Create(ctx, ks, key, v)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if o2.Won {
		return bad("a second create of one key won: create-if-absent is not enforced")
	}
	o3, err := e.st.Update(ctx, ks, key, v, o.Revision)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if !o3.Won {
		if gone, err := probeKeyGone(ctx, e.st, ks, key, o.Revision); err != nil || gone {
			return err
		}
		return bad("an update at the current revision lost: compare-and-swap is broken")
	}
	if o3.Revision <= o.Revision {
		return bad("an update minted revision %d after %d: revisions must strictly increase", o3.Revision, o.Revision)
	}
	o4, err := e.st.Update(ctx, ks, key, v, o.Revision)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if o4.Won {
		return bad("an update at a stale revision won: fencing would corrupt silently")
	}
	o5, err := e.st.Delete(ctx, ks, key, o3.Revision)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if !o5.Won {
		if gone, err := probeKeyGone(ctx, e.st, ks, key, o3.Revision); err != nil || gone {
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
func probeKeyGone(ctx context.Context, st Store, ks Keyspace, key string, rev uint64) (bool, error) {
	e, ok, err := st.Get(ctx, ks, key)
	if err != nil {
		return true, fmt.Errorf("probe: %w", err)
	}
	if ok && e.Revision == rev {
		return false, nil
	}
	_, _ = st.Delete(ctx, ks, key, AnyRevision)
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
		a.planning.joined(p, e.Revision)
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
	a.planning.joined(p, o.Revision)
	return nil
}

func (e *env) announce(ctx context.Context) error {
	key := prefixWorker + e.self
	o, err := e.st.Create(ctx, Ephemeral, key, e.renew.presenceValue())
	if err != nil {
		return fmt.Errorf("announce: %w", err)
	}
	if o.Won {
		e.renew.presenceWritten(o.Revision)
		return nil
	}
	got, ok, err := e.st.Get(ctx, Ephemeral, key)
	if err != nil {
		return fmt.Errorf("announce: %w", err)
	}
	if !ok {
		return Retryablef("announce: presence key %q vanished between create and read", key)
	}
	o, err = e.st.Update(ctx, Ephemeral, key, e.renew.presenceValue(), got.Revision)
	if err != nil {
		return fmt.Errorf("announce: %w", err)
	}
	if !o.Won {
		return Retryablef("announce: presence key %q changed under us", key)
	}
	e.renew.presenceWritten(o.Revision)
	return nil
}

// watchAll establishes both watches and applies their snapshots before the
// loop starts, so that the first decisions see the whole job.
func (a *actor) watchAll(ctx context.Context) error {
	if a.kw != nil && a.leader.term == nil {
		return a.syncGroups(ctx)
	}
	defer a.noteFullView()
	for _, w := range a.w.streams {
		if w.ch != nil {
			continue
		}
		if err := a.syncWatch(ctx, w); err != nil {
			return err
		}
	}
	return nil
}

func (a *actor) syncWatch(ctx context.Context, w *watchState) error {
	wctx, cancel := context.WithCancel(ctx)
	ch, err := a.st.Watch(wctx, w.ks, "")
	if err != nil {
		cancel()
		return fmt.Errorf("watch %s: %w", w.ks, err)
	}
	w.ch, w.cancel, w.collecting, w.snapshot = ch, cancel, true, nil
	w.since = a.job.mark()
	deadline := time.NewTimer(a.c.tm.snapshotBudget)
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
			w.close()
			return Retryablef("watch %s: snapshot not complete within %v", w.ks, a.c.tm.snapshotBudget)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
