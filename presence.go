package spate

import "context"

// Presence: this worker's membership record, which the renewer rewrites
// every beat, and what a lost renewal of it means (a live twin with this
// instance id, or a record the store dropped).

// presenceValue is the presence record this worker writes.
func (r *renewer) presenceValue() []byte {
	return encode(workerVal{Schema: SchemaVersion, Nonce: r.nonce, MaxInFlight: r.cfg.MaxInFlight})
}

// renewPresence rewrites this worker's presence record. A record that
// another process rewrote after our last write is a live twin: a process
// that shares our instance id announced itself after us (at startup a
// worker adopts whatever record its id has, since that may be its crashed
// predecessor's). The older process is the one that finds out, here, and it
// stops with a Fatal error; the newer keeps running — exactly one of two
// twins stops. A record that expired, or whose rewrite was ours (a lost
// reply), is simply rewritten.
func (r *renewer) renewPresence(ctx context.Context) {
	key := prefixWorker + r.self
	r.mu.Lock()
	off, rev, written := r.presOff, r.presRev, r.presWritten
	r.mu.Unlock()
	if off || written == 0 {
		return // parted, or not announced yet
	}
	if rev != 0 {
		o, err := r.st.Update(ctx, Ephemeral, key, r.presenceValue(), rev)
		if err != nil {
			r.log.Debug("presence renewal failed", "err", err)
			return
		}
		if o.Won {
			r.presenceWritten(o.Revision)
			return
		}
	}
	e, ok, err := r.st.Get(ctx, Ephemeral, key)
	if err != nil {
		return
	}
	var o Outcome
	if ok {
		w, derr := decodeWorker(key, e.Value)
		switch {
		case derr != nil:
			r.log.Warn("unreadable presence record under our instance id; rewriting it", "key", key, "err", derr)
		case w.Nonce == r.nonce:
			// Our own write whose reply was lost: adopt it below.
		case e.Revision > written:
			r.notes.put(renewNote{kind: noteFatal, err: Fatalf("two live workers share the instance id %q (another process rewrote our presence record %s after our last write); instance ids must be unique among live workers; this process, the older of the two, stops",
				r.self, key)})
			return
		}
		o, err = r.st.Update(ctx, Ephemeral, key, r.presenceValue(), e.Revision)
	} else {
		o, err = r.st.Create(ctx, Ephemeral, key, r.presenceValue())
	}
	if err == nil && o.Won {
		r.presenceWritten(o.Revision)
	}
}

// presenceWritten records a presence write of ours that landed.
func (r *renewer) presenceWritten(rev uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.presOff {
		return
	}
	r.presRev = max(r.presRev, rev)
	r.presWritten = max(r.presWritten, rev)
}

// presenceGone: our presence record expired; rewrite it now.
func (r *renewer) presenceGone(rev uint64) {
	r.mu.Lock()
	if rev > r.presRev {
		r.presRev = 0
	}
	r.mu.Unlock()
	r.checkPresence()
}

// checkPresence has the renewer check the presence record now.
func (r *renewer) checkPresence() {
	select {
	case r.check <- struct{}{}:
	default:
	}
}

// stopPresence ends presence renewal for good (the worker parts) and
// returns the revision to delete.
func (r *renewer) stopPresence() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.presOff = true
	return r.presRev
}
