package nats

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/driver"
)

// Tuning of the ordered consumers behind Watch.
const (
	// pullExpiry bounds each pull request.
	pullExpiry = 5 * time.Second
	// pullHeartbeat is the server's idle heartbeat on a pull request;
	// nats.go re-creates a consumer that misses two, so a pull request or
	// a consumer lost with its server is made good within about 2 s.
	pullHeartbeat = time.Second
	// maxResets is how many times in a row the ordered consumer may fail to
	// be re-created before the watch breaks with a Retryable error. This is
	// not a retry of a call: nats.go resumes the same stream at the next
	// sequence after the last delivered one, so no event is lost or
	// repeated, as a stream that never broke.
	maxResets = 5
	// inactiveThreshold lets the server drop a consumer its client forgot.
	inactiveThreshold = time.Minute
	// listFanout bounds the concurrent gets of a listing or snapshot.
	listFanout = 16
)

// subjectFilter is the subject filter that covers every key with prefix:
// NATS wildcards match whole tokens, so a prefix ending mid-segment ("spl")
// widens to its enclosing segment and the caller filters by string prefix.
func subjectFilter(pre, prefix string) string {
	cut := strings.LastIndexByte(prefix, '.')
	if cut < 0 {
		return pre + ">"
	}
	return pre + prefix[:cut+1] + ">"
}

// keySet returns every key under prefix whose subject holds a message (a
// value or a marker), sorted, as the server's subject index had them at one
// moment. Keys live for the whole call are all in it: unlike a walk over
// the stream, the index cannot miss a key whose message was superseded
// while it was being read.
func (b *bucket) keySet(ctx context.Context, prefix string) ([]string, error) {
	info, err := onStream(ctx, b, func() (*jetstream.StreamInfo, error) {
		return b.stream.Info(ctx, jetstream.WithSubjectFilter(subjectFilter(b.pre, prefix)))
	})
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		if k, ok := strings.CutPrefix(subj, b.pre); ok && strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys, nil
}

// read is one key's current state: a value, or absent at a marker's
// revision (0 when the subject is empty).
type read struct {
	entry spate.Entry
	live  bool
	rev   uint64
}

// readAll gets keys, up to listFanout at a time.
func (b *bucket) readAll(ctx context.Context, keys []string) ([]read, error) {
	out := make([]read, len(keys))
	errs := make([]error, len(keys))
	sem := make(chan struct{}, listFanout)
	var wg sync.WaitGroup
	for i, k := range keys {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[i], errs[i] = b.read(ctx, k)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("read %q: %w", k, errs[i])
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

func (b *bucket) read(ctx context.Context, key string) (read, error) {
	m, err := onStream(ctx, b, func() (*jetstream.RawStreamMsg, error) {
		return b.stream.GetLastMsgForSubject(ctx, b.pre+key)
	})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return read{}, nil
	}
	if err != nil {
		return read{}, classify(err)
	}
	if isMarker(m.Header) {
		return read{rev: m.Sequence}, nil
	}
	v := m.Data
	if v == nil {
		v = []byte{}
	}
	return read{entry: spate.Entry{Key: key, Value: v, Revision: m.Sequence}, live: true, rev: m.Sequence}, nil
}

// Watch implements [driver.Driver].
//
// A watch is one ordered consumer over the key's subjects that delivers every
// message still in the stream (history 1: each key's current value or
// marker) and then every new one, in stream order. A pump goroutine pulls
// its messages as fast as the server sends them.
//
// The snapshot folds those messages (a value sets its key, a marker removes
// it) until every key in the key set — the server's subject index, read just
// after the consumer was made — has had a message through the fold, and the
// consumer has caught up (a message reported nothing pending, every key has
// been seen for probeEvery, or no message came for probeEvery); a bucket
// with no message at all ends the snapshot at once. Then the snapshot's puts
// and one SnapshotDone go out, and the consumer's later messages follow as
// live events: snapshot and live stream are one stream, so there is no gap
// between them and each key's events stay in revision order.
//
// Why the key set: a walk over the stream alone cannot tell when it has seen
// every key, because a key rewritten while the walk is behind it loses its
// old message before the walk gets there and gains a new one further on.
// The walk must reach that new one, and only the index says the key exists.
// A key of the index whose messages all vanish before delivery (an expiry
// marker that itself aged out) is settled by a get once the walk goes idle.
//
// History is 1, so the server keeps only a key's newest revision: a revision
// superseded before the server sent it to the consumer (the consumer lagged
// by two writes of that key) is never delivered, and the watch goes straight
// to the newer one. Watches coalesce; they never skip a key's latest
// revision or reorder a key's revisions. A reader that falls more than
// watchBuffer messages behind the pump breaks the watch with a Retryable
// error. So does a consumer that stops delivering while the server still
// holds messages for it, or that the server no longer has, within
// [WatchStallBound] of the first change it withheld (see guard): a watch
// breaks, it is never silent.
func (s *store) Watch(ctx context.Context, ks spate.Keyspace, prefix string) (<-chan spate.WatchEvent, error) {
	b := s.b[ks-1]
	return s.watch(ctx, b, watchSpec{
		op:      "watch",
		label:   prefix,
		filters: []string{subjectFilter(b.pre, prefix)},
		deliver: jetstream.DeliverAllPolicy,
		match:   func(key string) bool { return strings.HasPrefix(key, prefix) },
		keySet: func(ctx context.Context) ([]string, error) {
			keys, err := b.keySet(ctx, prefix)
			if err != nil {
				return nil, classify(err)
			}
			return keys, nil
		},
	})
}

var _ spate.KeyWatcher = (*store)(nil)

// WatchKeys implements [spate.KeyWatcher] natively: the watch of Watch,
// with one ordered consumer whose filter subjects are the listed keys'
// exact subjects (the portable layer passes 1 to [spate.MaxWatchKeys] valid
// keys, sorted, each once), so the server sends it only those keys'
// messages. It delivers the last message of each listed subject (history
// 1: what DeliverAll would; the server starts such a consumer at the
// stream's first sequence and skips every subject not listed), then every
// new one, and shares Watch's snapshot, markers, coalescing, buffer and
// errors.
//
// The key set the snapshot waits for is read from the listed keys' last
// messages, one get per key (listFanout at a time), after the consumer was
// made. The subject index that Watch reads answers one subject filter per
// request: the narrowest filter over a set of exact keys is usually a
// wildcard over the whole keyspace (every split of the job), whose answer
// grows with the bucket instead of the keys listed, or else it takes one
// request per key anyway. The gets are as exact under concurrent writes:
// the snapshot needs each key by itself, not all keys at one instant. A key
// whose subject holds a message when its get runs has that message, or a
// newer one that superseded it, still to come from a consumer made before
// the get, so the snapshot waiting for it never waits in vain (a message
// that vanishes, an expiry marker aging out, is settled by a get when the
// consumer goes idle, as in Watch); a key that holds a message for the
// whole call is found by its get. A key first written after its get is a
// write concurrent with the watch: it reaches the snapshot or the live
// stream, with no gap either way, since both are the one consumer.
func (s *store) WatchKeys(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
	b := s.b[ks-1]
	filters := make([]string, len(keys))
	for i, k := range keys {
		filters[i] = b.pre + k
	}
	return s.watch(ctx, b, watchSpec{
		op:      "watch-keys",
		label:   keys[0],
		filters: filters,
		deliver: jetstream.DeliverLastPerSubjectPolicy,
		match: func(key string) bool {
			_, ok := slices.BinarySearch(keys, key)
			return ok
		},
		keySet: func(ctx context.Context) ([]string, error) {
			return b.heldKeys(ctx, keys)
		},
	})
}

// heldKeys returns those of keys (sorted) whose subject holds a message, a
// value or a marker, each read by a get.
func (b *bucket) heldKeys(ctx context.Context, keys []string) ([]string, error) {
	reads, err := b.readAll(ctx, keys)
	if err != nil {
		return nil, err
	}
	held := make([]string, 0, len(keys))
	for i, r := range reads {
		if r.rev != 0 {
			held = append(held, keys[i])
		}
	}
	return held, nil
}

// watchSpec is what one watch covers: the consumer's filter subjects and
// deliver policy, which keys of the delivered messages are the watch's,
// and how to read the key set its snapshot waits for.
type watchSpec struct {
	op      string // "watch" or "watch-keys", in errors and logs
	label   string // the prefix, or the first key listed, in errors and logs
	filters []string
	deliver jetstream.DeliverPolicy
	match   func(key string) bool
	// keySet returns, sorted, the keys of the watch whose subject holds a
	// message (a value or a marker); every key that holds one for the whole
	// call must be in it. Its errors are classified.
	keySet func(ctx context.Context) ([]string, error)
}

// watch opens the watch of spec on bucket b: the consumer, the key set, and
// the goroutines that run it (see Watch).
func (s *store) watch(ctx context.Context, b *bucket, spec watchSpec) (_ <-chan spate.WatchEvent, err error) {
	// ctx outlives the call (it bounds the watch); sctx bounds the setup.
	sctx, end := s.guard(ctx, "", &err)
	defer end()
	cons, err := onStream(sctx, b, func() (jetstream.Consumer, error) {
		return b.stream.OrderedConsumer(sctx, jetstream.OrderedConsumerConfig{
			FilterSubjects:    spec.filters,
			DeliverPolicy:     spec.deliver,
			InactiveThreshold: inactiveThreshold,
			MaxResetAttempts:  maxResets,
		})
	})
	if errors.Is(err, natsgo.ErrMaxPayload) {
		// The request carries every filter subject: not a value too large.
		return nil, fmt.Errorf("the consumer's %d filter subjects do not fit in one request under the server's max_payload (%d bytes): watch fewer keys: %w: %w",
			len(spec.filters), s.js.Conn().MaxPayload(), err, spate.ErrFatal)
	}
	if err != nil {
		return nil, classify(err)
	}
	keys, err := spec.keySet(sctx)
	if err != nil {
		return nil, err
	}
	pending := uint64(1)
	if info := cons.CachedInfo(); info != nil {
		pending = info.NumPending
	}
	it, err := cons.Messages(jetstream.PullExpiry(pullExpiry), jetstream.PullHeartbeat(pullHeartbeat))
	if err != nil {
		return nil, classify(err)
	}
	s.wg.Add(1)
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel)
	w := &watch{
		s: s, b: b, spec: spec, keys: keys, it: it, pending: pending,
		out:    make(chan spate.WatchEvent),
		signal: make(chan struct{}, 1),
	}
	// The consumer's pull requests are refused asynchronously: a watch
	// whose user lost (or never had) them breaks at once.
	unwatch := func() {}
	if s.perms != nil {
		unwatch = s.perms.add(func(v violation) {
			if s.scope.probeDenied(v, b) && s.unguarded.CompareAndSwap(false, true) {
				s.log.Warn("nats: the server refused a watch's check of its consumer: watches run without it, and one whose consumer stops delivering stays silent instead of breaking; grant the permission to enable the check",
					"bucket", b.name, "permission", "$JS.API.CONSUMER.INFO.KV_"+b.name+".*", "err", v.err)
			}
			if s.scope.watchOwns(v, b) {
				w.stop(&errPermDenied{v})
			}
		})
	}
	go func() {
		defer s.wg.Done()
		defer w.dropConsumer(cons) // after the reader has seen the end
		defer close(w.out)
		defer stop()
		defer unwatch()
		var pump sync.WaitGroup
		pump.Go(func() { w.pump(wctx) })
		pump.Go(func() { w.guard(wctx, cons) })
		w.run(wctx)
		cancel()
		pump.Wait()
		it.Stop()
	}()
	return w.out, nil
}

// dropConsumer deletes the ended watch's consumer from the server.
// Stopping nats.go's iterator leaves the consumer there until its
// inactive threshold (a minute): a fleet whose workers re-open their key
// watches every reconcile interval would leave the server about six idle
// consumers per open watch, each with up to MaxWatchKeys filter
// subjects. Best effort, within the permissions the driver documents
// (nats.go deletes the consumers it replaces the same way): a store being
// closed skips it, and a failure leaves the consumer to the threshold.
func (w *watch) dropConsumer(cons jetstream.Consumer) {
	if w.s.ctx.Err() != nil {
		return
	}
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	ctx, cancel := context.WithTimeout(w.s.ctx, dropWait)
	defer cancel()
	if err := w.b.stream.DeleteConsumer(ctx, info.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		w.s.log.Debug("nats: could not delete an ended watch's consumer; the server drops it after its inactive threshold",
			"bucket", w.b.name, "consumer", info.Name, "threshold", inactiveThreshold, "err", err)
	}
}

// Tuning of Watch.
const (
	// dropWait bounds the deletion of an ended watch's consumer.
	dropWait = 2 * time.Second
	// watchBuffer is how many live messages a watch holds for a slow
	// reader before it breaks with a Retryable error (as the memory store
	// does).
	watchBuffer = 4096
	// probeEvery is how long the snapshot waits for a message before it
	// takes the consumer as caught up.
	probeEvery = 100 * time.Millisecond
	// stallProbe is how long a watch goes without a message before it asks
	// the server about its consumer, and how long it waits for the answer
	// (see guard). WatchStallBound is eight of them.
	stallProbe = WatchStallBound / 8
)

type watch struct {
	s       *store
	b       *bucket
	spec    watchSpec
	keys    []string
	pending uint64 // messages the consumer had for the filter when made
	it      jetstream.MessagesContext
	out     chan spate.WatchEvent

	// got counts the messages the pump received, for guard.
	got atomic.Uint64

	// live is set once the snapshot is folded; from then on the queue is
	// capped at watchBuffer (while folding, it is bounded by the bucket).
	live atomic.Bool

	mu     sync.Mutex
	queue  []message
	err    error // why the pump stopped
	signal chan struct{}
}

// message is one decoded message.
type message struct {
	key     string
	value   []byte
	rev     uint64
	marker  bool
	pending uint64 // messages the server had left for the consumer
}

// pump pulls messages as fast as the server sends them, so that none is
// superseded while it waits for the reader.
func (w *watch) pump(ctx context.Context) {
	for {
		msg, err := w.it.Next(jetstream.NextContext(ctx))
		if err != nil {
			w.stop(err)
			return
		}
		meta, err := msg.Metadata()
		if err != nil {
			w.stop(fmt.Errorf("message metadata: %w", err))
			return
		}
		key, ok := strings.CutPrefix(msg.Subject(), w.b.pre)
		if !ok {
			continue
		}
		w.got.Add(1)
		m := message{key: key, value: msg.Data(), rev: meta.Sequence.Stream, marker: isMarker(msg.Headers()), pending: meta.NumPending}
		if m.value == nil {
			m.value = []byte{}
		}
		w.mu.Lock()
		if w.live.Load() && len(w.queue) >= watchBuffer {
			w.mu.Unlock()
			w.stop(fmt.Errorf("the watcher fell more than %d events behind", watchBuffer))
			return
		}
		w.queue = append(w.queue, m)
		w.mu.Unlock()
		w.wake()
	}
}

// guard breaks a watch whose consumer stopped delivering. The server's
// idle heartbeats and nats.go's resets of the ordered consumer cover a
// consumer or a pull request lost with its server, not a consumer that goes
// on answering with heartbeats while it delivers nothing (one on a replica
// that stopped applying, a paused one), nor a re-creation that takes longer
// than the watch may stay silent: nats.go retries it for up to a minute,
// and the watch would say nothing all that time.
//
// So after every stallProbe without a message, guard asks the server about
// the consumer, waiting up to stallProbe for the answer. A consumer that
// holds messages for the watch (pending), a consumer the server no longer
// has, and no answer (nats.go holds the consumer while it re-creates it)
// are suspect. Two suspect probes in a row, with no message between them,
// make guard delete the consumer on the server: nats.go then re-creates it
// after the last message delivered, as for a consumer lost with its
// server, so nothing is lost or repeated and a stall the server clears
// that way costs the watch nothing. Two more suspect probes, with still no
// message, break the watch with a Retryable error. A change written when
// the consumer stalled is thus delivered, or the watch broken, within
// eight stallProbes ([WatchStallBound]): four waits, each followed by a
// probe that may take as long. An idle watch costs one consumer-info request per
// stallProbe. A user not allowed that request (CONSUMER.INFO) runs its
// watches unguarded, as before the guard, with one warning.
func (w *watch) guard(ctx context.Context, cons jetstream.Consumer) {
	t := time.NewTimer(stallProbe)
	defer t.Stop()
	var probes sync.WaitGroup
	defer probes.Wait()
	seen := w.got.Load()
	var suspect error // why the last probe was suspect, or nil
	kicked := false   // the consumer was deleted for a stall
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if w.s.unguarded.Load() {
			return
		}
		if n := w.got.Load(); n != seen {
			seen, suspect, kicked = n, nil, false
			t.Reset(stallProbe)
			continue
		}
		why := w.probe(ctx, cons, &probes)
		if ctx.Err() != nil || w.s.unguarded.Load() {
			return
		}
		switch {
		case why == nil || w.got.Load() != seen:
			suspect, kicked = nil, false
		case suspect != nil && !kicked:
			w.s.log.Debug("nats: watch's consumer stalled; deleting it for nats.go to re-create", "bucket", w.b.name, "op", w.spec.op, "key", w.spec.label, "why", why)
			w.kick(ctx, cons, &probes)
			suspect, kicked = nil, true
		case suspect != nil:
			w.stop(fmt.Errorf("the watch's consumer delivered nothing for %v, also after it was re-created: %w", 4*stallProbe, why))
			return
		default:
			suspect = why
		}
		t.Reset(stallProbe)
	}
}

// kick deletes the watch's consumer on the server (on its own goroutine,
// in probes, for the reason probe gives), so that nats.go re-creates it.
func (w *watch) kick(ctx context.Context, cons jetstream.Consumer, probes *sync.WaitGroup) {
	probes.Go(func() {
		info := cons.CachedInfo()
		if info == nil {
			return
		}
		kctx, cancel := context.WithTimeout(ctx, stallProbe)
		defer cancel()
		if err := w.b.stream.DeleteConsumer(kctx, info.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			w.s.log.Debug("nats: could not delete a stalled watch's consumer", "bucket", w.b.name, "consumer", info.Name, "err", err)
		}
	})
}

// probe asks the server about the watch's consumer and returns why it is
// suspect, or nil: it holds messages for the watch, the server does not
// have it, or no answer came within stallProbe. The request runs on its own
// goroutine (in probes), since nats.go holds the consumer while it
// re-creates it.
func (w *watch) probe(ctx context.Context, cons jetstream.Consumer, probes *sync.WaitGroup) error {
	pctx, cancel := context.WithTimeout(ctx, stallProbe)
	defer cancel()
	type answer struct {
		info *jetstream.ConsumerInfo
		err  error
	}
	done := make(chan answer, 1)
	probes.Go(func() {
		info, err := cons.Info(pctx)
		done <- answer{info, err}
	})
	select {
	case a := <-done:
		switch {
		case errors.Is(a.err, jetstream.ErrConsumerNotFound):
			return fmt.Errorf("the server no longer has it: %w", a.err)
		case a.err != nil:
			return fmt.Errorf("the server did not say how it is: %w", a.err)
		case a.info.NumPending > 0:
			return fmt.Errorf("the server holds %d message(s) for it that it did not deliver", a.info.NumPending)
		}
		return nil
	case <-pctx.Done():
		return fmt.Errorf("the server did not say how it is within %v (the consumer is being re-created, or its server is unreachable)", stallProbe)
	}
}

// stop records why the watch stopped; the first reason stands.
func (w *watch) stop(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
	w.wake()
}

func (w *watch) wake() {
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// take returns the queued messages, or waits up to wait (0: no limit) for
// some; idle reports that the wait ran out.
func (w *watch) take(ctx context.Context, wait time.Duration) (batch []message, stopped error, idle bool) {
	var timeout <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	for {
		w.mu.Lock()
		batch, stopped = w.queue, w.err
		w.queue = nil
		w.mu.Unlock()
		if len(batch) > 0 || stopped != nil {
			return batch, stopped, false
		}
		select {
		case <-w.signal:
		case <-timeout:
			return nil, nil, true
		case <-ctx.Done():
			return nil, ctx.Err(), false
		}
	}
}

func (w *watch) send(ctx context.Context, ev spate.WatchEvent) bool {
	select {
	case w.out <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

// broken ends the watch with a Retryable error, or a Fatal one for a
// missing permission, unless the caller or Close ended it.
func (w *watch) broken(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	w.s.log.Debug("nats: watch broke", "bucket", w.b.name, "op", w.spec.op, "key", w.spec.label, "err", err)
	if pd := (*errPermDenied)(nil); errors.As(err, &pd) {
		w.send(ctx, spate.WatchEvent{Kind: spate.WatchError,
			Err: driver.OpError(driverName, w.spec.op, w.b.ks, w.spec.label, w.s.scope.deniedError(pd.v))})
		return
	}
	w.send(ctx, spate.WatchEvent{Kind: spate.WatchError, Err: driver.OpError(driverName, w.spec.op, w.b.ks, w.spec.label,
		fmt.Errorf("%w: %w", err, spate.ErrRetryable))})
}

// event is m as a watch event.
func (m message) event() spate.WatchEvent {
	if m.marker {
		return spate.WatchEvent{Kind: spate.WatchDelete, Key: m.key, Revision: m.rev}
	}
	return spate.WatchEvent{Kind: spate.WatchPut, Key: m.key, Value: m.value, Revision: m.rev}
}

func (w *watch) run(ctx context.Context) {
	state, rest, high, err := w.snapshot(ctx)
	if err != nil {
		w.broken(ctx, err)
		return
	}
	w.live.Store(true)
	for _, e := range state {
		if !w.send(ctx, spate.WatchEvent{Kind: spate.WatchPut, Key: e.Key, Value: e.Value, Revision: e.Revision}) {
			return
		}
	}
	if !w.send(ctx, spate.WatchEvent{Kind: spate.WatchSnapshotDone}) {
		return
	}
	for {
		for _, m := range rest {
			// The consumer delivers in stream order, so a message at or
			// below the newest revision already folded or sent is one
			// delivered again. nats.go re-makes a reset consumer after
			// the last message it delivered, so this should not happen,
			// but it was seen once on a loaded R3 cluster (a key's
			// snapshot revision came again as a live event; the cause
			// is not known). Sending it would repeat a change.
			if m.rev <= high {
				w.s.log.Debug("nats: watch dropped a message delivered again", "bucket", w.b.name, "op", w.spec.op, "key", m.key, "rev", m.rev, "newest", high)
				continue
			}
			high = m.rev
			if w.spec.match(m.key) && !w.send(ctx, m.event()) {
				return
			}
		}
		var stopped error
		rest, stopped, _ = w.take(ctx, 0)
		if len(rest) == 0 && stopped != nil {
			w.broken(ctx, stopped)
			return
		}
	}
}

// snapshot folds the consumer's messages until every key of the key set has
// been through the fold and the consumer has caught up (see Watch). It
// returns the live entries sorted by key, the messages of the last batch
// that came after the point where it stopped, and the newest revision it
// folded.
func (w *watch) snapshot(ctx context.Context) ([]spate.Entry, []message, uint64, error) {
	unseen := make(map[string]bool, len(w.keys))
	for _, k := range w.keys {
		unseen[k] = true
	}
	state := map[string]spate.Entry{}
	var last uint64 // the newest revision folded
	fold := func(m message) {
		delete(unseen, m.key)
		last = max(last, m.rev)
		if !w.spec.match(m.key) {
			return
		}
		if m.marker {
			delete(state, m.key)
		} else {
			state[m.key] = spate.Entry{Key: m.key, Value: m.value, Revision: m.rev}
		}
	}
	var rest []message
	// Caught up: a message reported nothing pending, or every key has been
	// seen for probeEvery already (the pending count is the server's
	// running estimate; it only decides how soon the snapshot ends, never
	// what is in it), or the consumer went idle.
	var allSeen time.Time
	caughtUp := func(m message) bool {
		if len(unseen) > 0 {
			return false
		}
		if allSeen.IsZero() {
			allSeen = time.Now()
		}
		return m.pending == 0 || time.Since(allSeen) >= probeEvery
	}
	done := len(unseen) == 0 && w.pending == 0
	for !done {
		batch, stopped, idle := w.take(ctx, probeEvery)
		for i, m := range batch {
			fold(m)
			if caughtUp(m) {
				done, rest = true, batch[i+1:]
				break
			}
		}
		if len(batch) == 0 && stopped != nil {
			return nil, nil, 0, stopped
		}
		if idle {
			if err := w.settle(ctx, unseen, last, fold); err != nil {
				return nil, nil, 0, err
			}
			done = len(unseen) == 0
		}
	}
	out := make([]spate.Entry, 0, len(state))
	for _, e := range state {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b spate.Entry) int { return strings.Compare(a.Key, b.Key) })
	return out, rest, last, nil
}

// settle looks up the key-set keys the idle consumer has not delivered: an
// empty subject (its last message aged out) drops the key; a message at or
// below the newest revision folded, which the consumer walked past without
// delivering, is folded from the read; a newer one is still on its way.
func (w *watch) settle(ctx context.Context, unseen map[string]bool, last uint64, fold func(message)) error {
	keys := make([]string, 0, len(unseen))
	for k := range unseen {
		keys = append(keys, k)
	}
	reads, err := w.b.readAll(ctx, keys)
	if err != nil {
		return err
	}
	for i, r := range reads {
		switch {
		case r.rev == 0:
			delete(unseen, keys[i])
		case r.rev <= last:
			fold(message{key: keys[i], value: r.entry.Value, rev: r.rev, marker: !r.live})
		}
	}
	return nil
}
