package spate

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Internal tests cannot import stores/mem or faultstore (both import this
// package), so the stateful tests run against fakeStore: a small in-memory
// Store with store-wide revisions, an optional per-operation latency and a
// scriptable fault hook. It does not expire ephemeral keys; the tests delete
// or rewrite keys themselves where an expiry or a peer's write is the point.

type fakeCall struct {
	op       string // create, update, get, delete, list, watch
	ks       Keyspace
	key      string
	value    []byte
	expected uint64
}

// fakeFault is what the fault hook decides for one call: err reported
// instead of the answer; with landed, the write applies first (a lost reply).
type fakeFault struct {
	err    error
	landed bool
}

type fakeStore struct {
	mu    sync.Mutex
	rev   uint64
	data  map[Keyspace]map[string]Entry
	calls []fakeCall
	delay time.Duration // added before every operation (virtual in a synctest bubble)
	fault func(fakeCall) fakeFault
	ttl   time.Duration
}

func newFakeStore() *fakeStore {
	return &fakeStore{data: map[Keyspace]map[string]Entry{Durable: {}, Ephemeral: {}}, ttl: 3 * time.Second}
}

func (s *fakeStore) begin(ctx context.Context, c fakeCall) (fakeFault, error) {
	s.mu.Lock()
	s.calls = append(s.calls, c)
	d, hook := s.delay, s.fault
	s.mu.Unlock()
	if d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fakeFault{}, Retryablef("fake: %s: %v", c.op, ctx.Err())
		}
	}
	if err := ctx.Err(); err != nil {
		return fakeFault{}, Retryablef("fake: %s: %v", c.op, err)
	}
	if hook != nil {
		return hook(c), nil
	}
	return fakeFault{}, nil
}

// put writes a key unconditionally (a test's setup, or a peer's write) and
// returns its revision.
func (s *fakeStore) put(ks Keyspace, key string, value []byte) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rev++
	s.data[ks][key] = Entry{Key: key, Value: value, Revision: s.rev}
	return s.rev
}

// remove deletes a key unconditionally (an expiry) and returns the delete's revision.
func (s *fakeStore) remove(ks Keyspace, key string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rev++
	delete(s.data[ks], key)
	return s.rev
}

func (s *fakeStore) entry(ks Keyspace, key string) (Entry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.data[ks][key]
	return e, ok
}

// count is the number of calls of op on keys starting with prefix.
func (s *fakeStore) count(op, prefix string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.calls {
		if c.op == op && strings.HasPrefix(c.key, prefix) {
			n++
		}
	}
	return n
}

func (s *fakeStore) setFault(f func(fakeCall) fakeFault) {
	s.mu.Lock()
	s.fault = f
	s.mu.Unlock()
}

func (s *fakeStore) Capabilities() Capabilities {
	return Capabilities{Driver: "fake", TTL: s.ttl, TTLFloor: time.Millisecond}
}

// write runs a conditional write: apply, under the lock, reports whether
// its condition held and makes the change. A fault may fail the call
// before it lands, or let it land and still report its error (a lost
// reply).
func (s *fakeStore) write(ctx context.Context, c fakeCall, apply func(data map[string]Entry, rev uint64) bool) (Outcome, error) {
	f, err := s.begin(ctx, c)
	if err != nil {
		return Outcome{}, err
	}
	if f.err != nil && !f.landed {
		return Outcome{}, f.err
	}
	s.mu.Lock()
	var o Outcome
	if apply(s.data[c.ks], s.rev+1) {
		s.rev++
		o = Won(s.rev)
	}
	s.mu.Unlock()
	if f.err != nil {
		return Outcome{}, f.err
	}
	return o, nil
}

func (s *fakeStore) Create(ctx context.Context, ks Keyspace, key string, value []byte) (Outcome, error) {
	return s.write(ctx, fakeCall{op: "create", ks: ks, key: key, value: value}, func(data map[string]Entry, rev uint64) bool {
		if _, ok := data[key]; ok {
			return false
		}
		data[key] = Entry{Key: key, Value: slices.Clone(value), Revision: rev}
		return true
	})
}

func (s *fakeStore) Update(ctx context.Context, ks Keyspace, key string, value []byte, expected uint64) (Outcome, error) {
	return s.write(ctx, fakeCall{op: "update", ks: ks, key: key, value: value, expected: expected}, func(data map[string]Entry, rev uint64) bool {
		if e, ok := data[key]; !ok || e.Revision != expected {
			return false
		}
		data[key] = Entry{Key: key, Value: slices.Clone(value), Revision: rev}
		return true
	})
}

func (s *fakeStore) Get(ctx context.Context, ks Keyspace, key string) (Entry, bool, error) {
	f, err := s.begin(ctx, fakeCall{op: "get", ks: ks, key: key})
	if err != nil {
		return Entry{}, false, err
	}
	if f.err != nil {
		return Entry{}, false, f.err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.data[ks][key]
	return e, ok, nil
}

func (s *fakeStore) Delete(ctx context.Context, ks Keyspace, key string, expected uint64) (Outcome, error) {
	return s.write(ctx, fakeCall{op: "delete", ks: ks, key: key, expected: expected}, func(data map[string]Entry, _ uint64) bool {
		if e, ok := data[key]; expected != AnyRevision && (!ok || e.Revision != expected) {
			return false
		}
		delete(data, key)
		return true
	})
}

func (s *fakeStore) List(ctx context.Context, ks Keyspace, prefix string) ([]Entry, error) {
	f, err := s.begin(ctx, fakeCall{op: "list", ks: ks, key: prefix})
	if err != nil {
		return nil, err
	}
	if f.err != nil {
		return nil, f.err
	}
	return s.listNow(ks, prefix), nil
}

func (s *fakeStore) listNow(ks Keyspace, prefix string) []Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Entry
	for k, e := range s.data[ks] {
		if strings.HasPrefix(k, prefix) {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// Watch delivers the snapshot and SnapshotDone, then nothing: the channel
// closes when ctx ends.
func (s *fakeStore) Watch(ctx context.Context, ks Keyspace, prefix string) (<-chan WatchEvent, error) {
	f, err := s.begin(ctx, fakeCall{op: "watch", ks: ks, key: prefix})
	if err != nil {
		return nil, err
	}
	if f.err != nil {
		return nil, f.err
	}
	entries := s.listNow(ks, prefix)
	ch := make(chan WatchEvent, len(entries)+1)
	for _, e := range entries {
		ch <- WatchEvent{Kind: WatchPut, Key: e.Key, Value: e.Value, Revision: e.Revision}
	}
	ch <- WatchEvent{Kind: WatchSnapshotDone}
	go func() {
		<-ctx.Done()
		close(ch)
	}()
	return ch, nil
}

func (s *fakeStore) Close() error { return nil }

var _ Store = (*fakeStore)(nil)

// ----- a minimal actor -------------------------------------------------------------

const testFP = "job:test:v1"

var testFPHash = fingerprintHash(testFP)

// testConfig is a valid configuration for the instance "me".
func testConfig() Config {
	return Config{InstanceID: "me", LeaseDuration: 3 * time.Second, OpTimeout: 300 * time.Millisecond,
		MaxAttempts: 4, MaxInFlight: 4, DrainDeadline: 2 * time.Second, RebalanceDelay: 20 * time.Second}.WithDefaults()
}

// newTestActor builds an actor the way Start does, without running its
// loop: tests call its methods and pump its results themselves. st may be
// nil for tests that never reach the store.
func newTestActor(t testing.TB, st Store, cfg Config) *actor {
	t.Helper()
	m, err := newCoordMetrics(nil, nil)
	require.NoError(t, err)
	c := &StoreCoordinator{cfg: cfg, tm: deriveTimings(cfg), store: st, log: slog.New(slog.DiscardHandler), m: m, nonce: "nonce-me",
		cmds: make(chan *command, commandQueueDepth), done: make(chan struct{}), closedAll: make(chan struct{}), started: true}
	a := newActor(c, nil, testFP)
	c.act = a
	ctx, cancel := context.WithCancel(context.Background())
	a.ctx = ctx
	t.Cleanup(func() {
		cancel()
		a.io.wg.Wait() // no I/O goroutine outlives its test
		a.w.rewatch.Stop()
	})
	return a
}

// events drains the events the actor emitted.
func events(t testing.TB, a *actor) []Event {
	t.Helper()
	ev, err := a.c.Poll()
	require.NoError(t, err)
	return ev
}

// pumpOnce waits for the results of I/O beside the loop and runs them, as
// the loop does.
func pumpOnce(t testing.TB, a *actor) {
	t.Helper()
	select {
	case <-a.io.results.sig:
		require.NoError(t, a.io.runResults())
	case <-time.After(10 * time.Second):
		t.Fatal("no I/O result arrived")
	}
}

// settleIO runs results until no I/O is in flight and none was started by
// the last results run.
func settleIO(t testing.TB, a *actor) {
	t.Helper()
	for {
		done := make(chan struct{})
		go func() {
			a.io.wg.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("I/O did not settle")
		}
		select {
		case <-a.io.results.sig:
		default:
		}
		ks := a.io.results.take()
		if len(ks) == 0 {
			return
		}
		for _, k := range ks {
			if k != nil {
				require.NoError(t, k())
			}
		}
	}
}

// send hands cmd to the actor and pumps results until it is answered.
func send(t testing.TB, a *actor, cmd *command) error {
	t.Helper()
	cmd.reply = make(chan error, 1)
	require.NoError(t, a.handle(cmd))
	for {
		select {
		case err := <-cmd.reply:
			return err
		case <-a.io.results.sig:
			require.NoError(t, a.io.runResults())
		case <-time.After(10 * time.Second):
			t.Fatal("the command was never answered")
		}
	}
}

// rec is a progress record of the test job.
func rec(id string, epoch uint64, owner string) *progressRecord {
	r := &progressRecord{Schema: SchemaVersion, ID: id, FP: testFPHash, Epoch: epoch, Status: statusRunnable}
	if owner != "" {
		r.Owner = strPtr(owner)
	}
	return r
}

func wm(v int64) *int64 { return &v }

// holdSplit makes the actor hold split id at epoch, as a claim that landed
// leaves it: the progress record and the lease in the store, the view
// folded, the tenancy owned and its lease renewed by the renewer.
func holdSplit(t testing.TB, a *actor, st *fakeStore, id string, epoch uint64, r *progressRecord) {
	t.Helper()
	if r == nil {
		r = rec(id, epoch, a.self)
	}
	rev := st.put(Durable, prefixSplit+id, encode(r))
	lv := leaseVal{Schema: SchemaVersion, Owner: a.self, Nonce: a.nonce, Epoch: epoch}
	leaseRev := st.put(Ephemeral, prefixSplit+id, encode(lv))
	a.upsert(id, r, rev, live)
	v := a.job.view(id)
	v.spec = &specRecord{Schema: SchemaVersion, ID: id, FP: testFPHash, Weight: 1, Descriptor: []byte{}}
	v.lease, v.leaseRev, v.leaseAt = &lv, leaseRev, a.job.clock
	t2 := &tenancy{epoch: epoch}
	a.worker.owned[id] = t2
	a.renew.hold(id, epoch, leaseRev, time.Now(), nil)
	a.io.openCell(id, t2, a.job.splits[id])
}

func storedProgress(t testing.TB, st *fakeStore, id string) (*progressRecord, uint64) {
	t.Helper()
	e, ok := st.entry(Durable, prefixSplit+id)
	require.True(t, ok, "split %s has no progress record", id)
	r, err := decodeProgress(e.Key, id, e.Value, testFPHash)
	require.NoError(t, err)
	return r, e.Revision
}

func lostSplits(evs []Event) []string {
	var out []string
	for _, e := range evs {
		if l, ok := e.(Lost); ok {
			out = append(out, l.Split.String())
		}
	}
	return out
}

func eventNames(evs []Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = fmt.Sprint(e)
	}
	return out
}
