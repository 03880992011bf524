package conformance

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/spate-go/spate"
)

// The rules of the optional [spate.Releaser] capability. A store without it
// skips them, with skipNoReleaser as the reason (a visible SKIP under
// RunStore, a Skipped [Result] under CheckStore).

// releaseRules are the store rules of the Releaser capability; StoreRules
// ends with them.
var releaseRules = []Rule{
	{Name: "ReleaserIsReported",
		Contract: "A store that reports it implements Releaser, and a store that implements Releaser without reporting it is used as one without.",
		body:     testReleaserReported},
	{Name: "ReleaseUpdatesAndDeletes",
		Contract: "UpdateAndDelete updates durableKey in the [Durable] keyspace as [Store.Update] does and, only if that update wins, deletes ephemeralKey in the [Ephemeral] keyspace if it exists at exactly leaseExpected, both in one atomic write.",
		body:     testReleaseUpdatesAndDeletes},
	{Name: "ReleaseLostUpdateWritesNothing",
		Contract: "A lost update writes nothing: both outcomes are Lost and the ephemeral key is left as it is.",
		body:     testReleaseLostUpdate},
	{Name: "ReleaseLostGuardKeepsTheUpdate",
		Contract: "A delete that loses its guard does not undo the update: updated is Won and deleted Lost.",
		body:     testReleaseLostGuard},
	{Name: "ReleaseOutcomesCarryTheirRevisions",
		Contract: "The outcomes' revisions are those [Store.Update] and [Store.Delete] would report for the two writes.",
		body:     testReleaseRevisions},
	{Name: "ReleaseIsSeenAtOnce",
		Contract: "Both changes become visible at once: no read sees the delete without the update, and the watchers of each keyspace receive that keyspace's change in its revision order.",
		body:     testReleaseSeenAtOnce},
	{Name: "ReleaseAtAnyRevisionIsAPlainUpdate",
		Contract: "A leaseExpected of [AnyRevision] deletes nothing (no live key has it): the call is then a plain Update.",
		body:     testReleaseAnyRevision},
	{Name: "ReleaseArgumentsAndCloseAreChecked",
		Contract: "Its arguments, errors and Close are those of Update and Delete.",
		body:     testReleaseArguments},
}

// skipNoReleaser is the reason the Releaser rules give when they skip.
const skipNoReleaser = "the store does not have the optional spate.Releaser capability (Capabilities.UpdateAndDelete is false, or the store does not implement the method): its rules do not apply, and the coordinator releases a split in two calls"

// releaser returns s's Releaser, or skips the rule.
func releaser(e *env, s spate.Store) spate.Releaser {
	e.t.Helper()
	r, ok := spate.ReleaserOf(s)
	if !ok {
		e.t.Skip(skipNoReleaser)
	}
	return r
}

func mustRelease(e *env, r spate.Releaser, key, value string, exp, leaseExp uint64) (spate.Outcome, spate.Outcome) {
	e.t.Helper()
	u, d, err := r.UpdateAndDelete(e.ctx, key, []byte(value), exp, key, leaseExp)
	if err != nil {
		e.t.Fatalf("update-and-delete %q at %d, lease at %d: unexpected error: %v", key, exp, leaseExp, err)
	}
	return u, d
}

// held creates key in both keyspaces, as a claimed split: its record and
// its lease.
func held(e *env, s spate.Store, key string) (rec, lease uint64) {
	e.t.Helper()
	return mustCreate(e, s, spate.Durable, key, "owned"), mustCreate(e, s, spate.Ephemeral, key, "lease")
}

func expectEntry(e *env, s spate.Store, ks spate.Keyspace, key, value string, rev uint64, rule string) {
	e.t.Helper()
	en, ok := mustGet(e, s, ks, key)
	if !ok || string(en.Value) != value || (rev != 0 && en.Revision != rev) {
		e.t.Errorf("rule: %s; %s %q reads %q@%d (present %t), want %q@%d", rule, ks, key, en.Value, en.Revision, ok, value, rev)
	}
}

func expectAbsent(e *env, s spate.Store, ks spate.Keyspace, key, rule string) {
	e.t.Helper()
	if en, ok := mustGet(e, s, ks, key); ok {
		e.t.Errorf("rule: %s; %s %q still reads %q@%d", rule, ks, key, en.Value, en.Revision)
	}
}

func testReleaserReported(e *env) {
	s := e.open()
	reported := s.Capabilities().UpdateAndDelete
	_, implements := s.(spate.Releaser)
	switch {
	case reported && !implements:
		e.t.Errorf("rule: a store that reports Capabilities.UpdateAndDelete implements spate.Releaser; %T does not (a wrapper that does not pass the method on must clear the flag)", driverOf(s))
	case !reported && implements:
		if _, ok := spate.ReleaserOf(s); ok {
			e.t.Errorf("rule: a store that implements Releaser without reporting it is used as one without; ReleaserOf returned it")
		}
		e.t.Skip(skipNoReleaser)
	case !reported:
		e.t.Skip(skipNoReleaser)
	default:
		if _, ok := spate.ReleaserOf(s); !ok {
			e.t.Errorf("rule: ReleaserOf returns a store that reports and implements Releaser; it did not")
		}
	}
}

func testReleaseUpdatesAndDeletes(e *env) {
	s, other := e.open(), e.open()
	r := releaser(e, s)
	rec, lease := held(e, s, "rls.k")
	u, d := mustRelease(e, r, "rls.k", "released", rec, lease)
	if !u.Won {
		e.t.Fatalf("rule: the update at the durable key's current revision wins; it lost")
	}
	if !d.Won {
		e.t.Errorf("rule: after a won update, the delete of the ephemeral key at its exact revision wins; it lost")
	}
	for _, c := range []spate.Store{s, other} {
		expectEntry(e, c, spate.Durable, "rls.k", "released", u.Revision, "the won update wrote the durable key")
		expectAbsent(e, c, spate.Ephemeral, "rls.k", "the won delete removed the ephemeral key")
	}
	// The keyspaces stay apart: the ephemeral keyspace has no such durable
	// write, the durable keyspace no such delete.
	if en, ok := mustGet(e, s, spate.Ephemeral, "rls.k"); ok {
		e.t.Errorf("rule: UpdateAndDelete writes durableKey in the durable keyspace only; ephemeral %q reads %q", "rls.k", en.Value)
	}
	// Distinct keys.
	rec2 := mustCreate(e, s, spate.Durable, "rls.rec", "owned")
	lease2 := mustCreate(e, s, spate.Ephemeral, "rls.lease", "lease")
	u2, d2, err := r.UpdateAndDelete(e.ctx, "rls.rec", []byte("released"), rec2, "rls.lease", lease2)
	if err != nil {
		e.t.Fatalf("update-and-delete of two distinct keys: unexpected error: %v", err)
	}
	if !u2.Won || !d2.Won {
		e.t.Errorf("rule: the update and the delete win on distinct keys too; won %t and %t", u2.Won, d2.Won)
	}
	expectEntry(e, s, spate.Durable, "rls.rec", "released", u2.Revision, "the won update wrote the durable key")
	expectAbsent(e, s, spate.Ephemeral, "rls.lease", "the won delete removed the ephemeral key")
	if _, ok := mustGet(e, s, spate.Durable, "rls.lease"); ok {
		e.t.Errorf("rule: the update writes durableKey only")
	}
}

func testReleaseLostUpdate(e *env) {
	s := e.open()
	r := releaser(e, s)
	rec, lease := held(e, s, "rls.k")
	moved := mustUpdate(e, s, spate.Durable, "rls.k", "moved", rec)
	u, d := mustRelease(e, r, "rls.k", "released", rec, lease)
	if u.Won || d.Won {
		e.t.Errorf("rule: an update at a stale revision loses and then nothing is deleted: both outcomes Lost; won %t and %t", u.Won, d.Won)
	}
	expectEntry(e, s, spate.Durable, "rls.k", "moved", moved.Revision, "a lost update writes nothing")
	expectEntry(e, s, spate.Ephemeral, "rls.k", "lease", lease, "a lost update deletes nothing: the ephemeral key is left as it is")

	// An absent durable key: the update loses, the lease stays.
	lease2 := mustCreate(e, s, spate.Ephemeral, "rls.absent", "lease")
	u, d = mustRelease(e, r, "rls.absent", "released", rec, lease2)
	if u.Won || d.Won {
		e.t.Errorf("rule: an update of an absent key loses and then nothing is deleted; won %t and %t", u.Won, d.Won)
	}
	if _, ok := mustGet(e, s, spate.Durable, "rls.absent"); ok {
		e.t.Errorf("rule: a lost update never creates the durable key")
	}
	expectEntry(e, s, spate.Ephemeral, "rls.absent", "lease", lease2, "a lost update deletes nothing")
}

func testReleaseLostGuard(e *env) {
	s := e.open()
	r := releaser(e, s)
	rec, lease := held(e, s, "rls.k")
	beat := mustUpdate(e, s, spate.Ephemeral, "rls.k", "renewed", lease)
	u, d := mustRelease(e, r, "rls.k", "released", rec, lease)
	if !u.Won {
		e.t.Fatalf("rule: a delete that loses its guard does not undo the update: the update at the current revision wins; it lost")
	}
	if d.Won {
		e.t.Errorf("rule: the delete wins only if the ephemeral key is at exactly leaseExpected; it won at %d with the key at %d", lease, beat.Revision)
	}
	expectEntry(e, s, spate.Durable, "rls.k", "released", u.Revision, "a delete that loses its guard does not undo the update")
	expectEntry(e, s, spate.Ephemeral, "rls.k", "renewed", beat.Revision, "a delete that loses its guard deletes nothing")

	// An absent ephemeral key: the update wins, the delete loses.
	rec2 := mustCreate(e, s, spate.Durable, "rls.nolease", "owned")
	u, d = mustRelease(e, r, "rls.nolease", "released", rec2, lease)
	if !u.Won || d.Won {
		e.t.Errorf("rule: with the ephemeral key absent the update wins and the delete loses; won %t and %t", u.Won, d.Won)
	}
	expectEntry(e, s, spate.Durable, "rls.nolease", "released", u.Revision, "a delete that loses its guard does not undo the update")
}

func testReleaseRevisions(e *env) {
	s := e.open()
	r := releaser(e, s)
	rec, lease := held(e, s, "rls.k")
	u, d := mustRelease(e, r, "rls.k", "released", rec, lease)
	if !u.Won || !d.Won {
		e.t.Fatalf("update-and-delete at the current revisions: won %t and %t", u.Won, d.Won)
	}
	if u.Revision <= rec {
		e.t.Errorf("rule: a won update reports a strictly larger revision; %d -> %d", rec, u.Revision)
	}
	expectEntry(e, s, spate.Durable, "rls.k", "released", u.Revision, "the update's outcome carries the revision it minted")
	if d.Revision != 0 && d.Revision <= lease {
		e.t.Errorf("rule: a delete's revision is greater than every revision the key held before; %d <= %d", d.Revision, lease)
	}
	again := mustCreate(e, s, spate.Ephemeral, "rls.k", "again")
	if again <= lease || (d.Revision != 0 && again <= d.Revision) {
		e.t.Errorf("rule: revisions strictly increase per key across delete and re-create; lease %d, delete %d, re-create %d", lease, d.Revision, again)
	}
	rec2, lease2 := held(e, s, "rls.lost")
	mustUpdate(e, s, spate.Durable, "rls.lost", "moved", rec2)
	u, d = mustRelease(e, r, "rls.lost", "released", rec2, lease2)
	if u.Revision != 0 || d.Revision != 0 {
		e.t.Errorf("rule: a lost write's revision is 0; got %d and %d", u.Revision, d.Revision)
	}
}

func testReleaseSeenAtOnce(e *env) {
	s, reader := e.open(), e.open()
	r := releaser(e, s)
	dw := mustWatch(e, s, spate.Durable, "rls.")
	ew := mustWatch(e, s, spate.Ephemeral, "rls.")
	readSnapshot(e, dw)
	readSnapshot(e, ew)
	rec, lease := held(e, s, "rls.k")
	expectEvent(e, dw, "rls.k", eventWait)
	expectEvent(e, ew, "rls.k", eventWait)

	// A reader reads the ephemeral key, then the durable one: once it sees
	// the lease gone, the record must read released.
	var (
		mu        sync.Mutex
		violation string
		reads     int
	)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			_, leased, err1 := reader.Get(e.ctx, spate.Ephemeral, "rls.k")
			en, _, err2 := reader.Get(e.ctx, spate.Durable, "rls.k")
			mu.Lock()
			reads++
			if err1 == nil && err2 == nil && !leased && string(en.Value) != "released" && violation == "" {
				violation = fmt.Sprintf("the lease read deleted while the record still read %q@%d", en.Value, en.Revision)
			}
			mu.Unlock()
			if err1 != nil || err2 != nil || !leased {
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	u, d := mustRelease(e, r, "rls.k", "released", rec, lease)
	select {
	case <-done:
	case <-time.After(eventWait):
		close(stop)
		<-done
	}
	mu.Lock()
	if violation != "" {
		e.t.Errorf("rule: no read sees the delete without the update; %s", violation)
	}
	e.t.Logf("%d concurrent reads", reads)
	mu.Unlock()
	if !u.Won || !d.Won {
		e.t.Fatalf("update-and-delete at the current revisions: won %t and %t", u.Won, d.Won)
	}
	ev := expectEvent(e, dw, "rls.k", eventWait)
	if ev.Kind != spate.WatchPut || string(ev.Value) != "released" || ev.Revision != u.Revision {
		e.t.Errorf("rule: the durable keyspace's watchers receive the update; got %v %q@%d, want put %q@%d", ev.Kind, ev.Value, ev.Revision, "released", u.Revision)
	}
	ev = expectEvent(e, ew, "rls.k", eventWait)
	if ev.Kind != spate.WatchDelete || ev.Revision <= lease || (d.Revision != 0 && ev.Revision != d.Revision) {
		e.t.Errorf("rule: the ephemeral keyspace's watchers receive the delete; got %v@%d, want delete@%d (lease at %d)", ev.Kind, ev.Revision, d.Revision, lease)
	}
	// Each keyspace's revision order holds on after the call.
	after := mustUpdate(e, s, spate.Durable, "rls.k", "after", u.Revision)
	ev = expectEvent(e, dw, "rls.k", eventWait)
	if ev.Revision != after.Revision || ev.Revision <= u.Revision {
		e.t.Errorf("rule: events of one key arrive in revision order; after %d came %d (want %d)", u.Revision, ev.Revision, after.Revision)
	}
}

func testReleaseAnyRevision(e *env) {
	s := e.open()
	r := releaser(e, s)
	rec, lease := held(e, s, "rls.k")
	u, d := mustRelease(e, r, "rls.k", "released", rec, spate.AnyRevision)
	if !u.Won {
		e.t.Errorf("rule: with leaseExpected AnyRevision the call is a plain Update, which wins at the current revision; it lost")
	}
	if d.Won {
		e.t.Errorf("rule: a leaseExpected of AnyRevision deletes nothing; the delete won")
	}
	expectEntry(e, s, spate.Durable, "rls.k", "released", u.Revision, "the plain Update wrote the durable key")
	expectEntry(e, s, spate.Ephemeral, "rls.k", "lease", lease, "a leaseExpected of AnyRevision deletes nothing")
}

func testReleaseArguments(e *env) {
	s := e.open()
	r := releaser(e, s)
	rec, lease := held(e, s, "rls.k")
	check := func(what string, err error, is error) {
		e.t.Helper()
		if err == nil {
			e.t.Errorf("rule: %s is refused as it is by Update and Delete; no error", what)
			return
		}
		if !errors.Is(err, is) || !spate.IsFatal(err) {
			e.t.Errorf("rule: %s is a Fatal %v, as for Update and Delete; got %v", what, is, err)
		}
	}
	_, _, err := r.UpdateAndDelete(e.ctx, "rls..k", []byte("x"), rec, "rls.k", lease)
	check("an invalid durable key", err, spate.ErrInvalidKey)
	_, _, err = r.UpdateAndDelete(e.ctx, "rls.k", []byte("x"), rec, ".rls.k", lease)
	check("an invalid ephemeral key", err, spate.ErrInvalidKey)
	if limit := s.Capabilities().MaxValueSize; limit > 0 {
		_, _, err = r.UpdateAndDelete(e.ctx, "rls.k", make([]byte, limit+1), rec, "rls.k", lease)
		check("a value over the cap", err, spate.ErrValueTooLarge)
	}
	expectEntry(e, s, spate.Durable, "rls.k", "owned", rec, "a refused call writes nothing")
	expectEntry(e, s, spate.Ephemeral, "rls.k", "lease", lease, "a refused call deletes nothing")

	closed := e.open()
	cr := releaser(e, closed)
	if err := closed.Close(); err != nil {
		e.t.Fatalf("close: %v", err)
	}
	_, _, err = cr.UpdateAndDelete(e.ctx, "rls.k", []byte("x"), rec, "rls.k", lease)
	check("a call after Close", err, spate.ErrClosed)
	if err != nil && !strings.Contains(err.Error(), "closed") {
		e.t.Errorf("rule: the closed store's error says so; got %v", err)
	}
	expectEntry(e, s, spate.Durable, "rls.k", "owned", rec, "a call after Close writes nothing")
}
