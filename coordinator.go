package spate

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// CoordinatorOption tunes a [StoreCoordinator].
type CoordinatorOption func(*coordOptions)

type coordOptions struct {
	logger *slog.Logger
	reg    prometheus.Registerer
	labels prometheus.Labels
}

// WithLogger sets the logger (default: slog.Default()). Warnings are
// throttled: each distinct message passes at most 5 times per 10 s, and the
// next copy that passes carries "suppressed", the number held back (a store
// refusing writes would otherwise warn for every split on every retry).
// Errors and lower levels pass untouched.
func WithLogger(l *slog.Logger) CoordinatorOption { return func(o *coordOptions) { o.logger = l } }

// WithRegisterer registers the spate_coordination_* metrics with reg. Without
// it the metrics are kept but not exported.
func WithRegisterer(reg prometheus.Registerer) CoordinatorOption {
	return func(o *coordOptions) { o.reg = reg }
}

// WithMetricLabels adds constant labels to every metric (pipeline,
// component, ...), so several coordinators can share one registry.
func WithMetricLabels(l prometheus.Labels) CoordinatorOption {
	return func(o *coordOptions) { o.labels = l }
}

// commandQueueDepth bounds the commands waiting for the actor.
const commandQueueDepth = 64

// StoreCoordinator is a [SplitCoordinator] over any [Store] that keeps the
// store contract.
//
// One goroutine per coordinator (the actor) owns the local view of the job
// and every decision; store I/O runs beside it, so it never waits on the
// store. Leases and presence are renewed by a renewer on their own
// schedule, never queued behind commits, listings, watch re-establishment
// or planning; commits on different splits run concurrently (one in flight
// per split); the planner runs off the actor too. The methods are a
// synchronous handle: commands wait at most 3×OpTimeout (and their
// context), Poll never blocks. A failure of the actor is sticky: once
// the events queued before it are delivered, every call returns it.
//
// All methods are safe for concurrent use, but the seam expects one
// controller goroutine to drive it.
type StoreCoordinator struct {
	cfg   Config
	tm    timings // derived from cfg once (timings.go)
	store Store   // the metered store
	log   *slog.Logger
	m     *coordMetrics
	nonce string

	cmds      chan *command
	done      chan struct{} // closed when the actor exits
	closedAll chan struct{} // closed when the first Close or Abandon has finished
	stop      context.CancelFunc
	act       *actor

	relMu sync.Mutex // serialises direct releases after the actor exited

	// The fenced commit on the caller's goroutine (commit.go).
	cells   sync.Map     // split id → *fenceCell, for the splits held
	fastMu  sync.RWMutex // held shared by commits in flight; the exiting actor waits for them
	fastOff atomic.Bool  // the actor exited: every commit takes the loop's path

	mu      sync.Mutex
	waker   Waker
	started bool
	closed  bool
	events  []Event
	failure error
}

var _ SplitCoordinator = (*StoreCoordinator)(nil)

// NewStoreCoordinator validates cfg against store and returns a coordinator
// ready for SetWaker and Start. The store's TTL must equal
// cfg.LeaseDuration: renewal cadence comes from the config, expiry from the
// store, and mismatched values silently churn leases. The coordinator does
// not close the store.
func NewStoreCoordinator(store Store, cfg Config, opts ...CoordinatorOption) (*StoreCoordinator, error) {
	if store == nil {
		return nil, Fatalf("coordinator: store is nil")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	caps := store.Capabilities()
	if caps.TTL != cfg.LeaseDuration {
		return nil, Fatalf("coordinator: the %s store's TTL is %v but lease_duration is %v; they must be equal (open the store with the lease duration as its TTL)",
			caps.Driver, caps.TTL, cfg.LeaseDuration)
	}
	if caps.TTLFloor > cfg.LeaseDuration {
		return nil, Fatalf("coordinator: lease_duration %v is below the %s store's TTL floor of %v", cfg.LeaseDuration, caps.Driver, caps.TTLFloor)
	}
	var o coordOptions
	for _, f := range opts {
		f(&o)
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	warnLostCapabilities(o.logger.With("instance", cfg.InstanceID), store)
	m, err := newCoordMetrics(o.reg, o.labels)
	if err != nil {
		return nil, err
	}
	tm := deriveTimings(cfg)
	c := &StoreCoordinator{
		cfg:   cfg,
		tm:    tm,
		store: newMeteredStore(store, cfg.OpTimeout, tm.list, m),
		log:   slog.New(newThrottle(o.logger.Handler(), warnEvery)).With("instance", cfg.InstanceID),
		m:     m,
		nonce: randomHex(),
		cmds:  make(chan *command, commandQueueDepth),
		done:  make(chan struct{}),

		closedAll: make(chan struct{}),
	}
	return c, nil
}

// InstanceID is this worker's instance id.
func (c *StoreCoordinator) InstanceID() string { return c.cfg.InstanceID }

// Config is the effective configuration, defaults applied.
func (c *StoreCoordinator) Config() Config { return c.cfg }

// SetWaker implements [SplitCoordinator].
func (c *StoreCoordinator) SetWaker(w Waker) {
	c.mu.Lock()
	c.waker = w
	c.mu.Unlock()
}

// Start implements [SplitCoordinator]: it spawns the actor, which probes the
// store, joins the job and starts claiming. It returns at once; startup
// failures surface from Poll.
func (c *StoreCoordinator) Start(planner SplitPlanner) error {
	if planner == nil {
		return Fatalf("coordinator: planner is nil")
	}
	fp := planner.Fingerprint()
	if fp == "" {
		return Fatalf("coordinator: the planner's fingerprint is empty; derive it from the job's configuration")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("coordinator: start after close: %w: %w", ErrClosed, ErrFatal)
	}
	if c.started {
		return Fatalf("coordinator: Start called twice")
	}
	c.started = true
	ctx, cancel := context.WithCancel(context.Background())
	c.stop = cancel
	c.act = newActor(c, planner, fp)
	go func() {
		defer close(c.done)
		c.act.run(ctx)
	}()
	return nil
}

// Poll implements [SplitCoordinator]. It never blocks.
func (c *StoreCoordinator) Poll() ([]Event, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.events) > 0 {
		ev := c.events
		c.events = nil
		return ev, nil
	}
	return nil, c.failure
}

// emit queues events for Poll and wakes the waiter. Called by the actor.
func (c *StoreCoordinator) emit(ev ...Event) {
	c.mu.Lock()
	c.events = append(c.events, ev...)
	w := c.waker
	c.mu.Unlock()
	w.Wake()
}

// fail records the actor's terminal failure (the first one sticks).
func (c *StoreCoordinator) fail(err error) {
	c.mu.Lock()
	if c.failure == nil {
		c.failure = err
	}
	w := c.waker
	c.mu.Unlock()
	w.Wake()
}

func (c *StoreCoordinator) sticky() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("coordinator: %w: %w", ErrClosed, ErrFatal)
	}
	if !c.started {
		return Fatalf("coordinator: not started")
	}
	return c.failure
}

type cmdKind uint8

const (
	cmdCommit cmdKind = iota + 1
	cmdFail
	cmdRelease
	cmdReleaseDrained
	cmdDecline
	cmdDepart
	cmdDivide
)

type command struct {
	kind     cmdKind
	split    SplitID
	epoch    LeaseEpoch // commit: the tenancy it is for (0: whichever is held)
	splits   []SplitID
	progress SplitProgress
	reason   string
	division *Division // divide
	reply    chan error
}

// do hands a command to the actor and waits for its answer, at most
// 3×OpTimeout and as long as ctx allows.
func (c *StoreCoordinator) do(ctx context.Context, cmd *command) error {
	if err := c.sticky(); err != nil {
		return err
	}
	cmd.reply = make(chan error, 1)
	timer := time.NewTimer(c.tm.command)
	defer timer.Stop()
	select {
	case c.cmds <- cmd:
	case <-timer.C:
		return c.slowErr()
	case <-ctx.Done():
		return Retryablef("coordinator: %w", ctx.Err())
	case <-c.done:
		return c.deadErr()
	}
	return c.await(ctx, cmd, timer)
}

// await waits for the answer to a command the actor has taken.
func (c *StoreCoordinator) await(ctx context.Context, cmd *command, timer *time.Timer) error {
	select {
	case err := <-cmd.reply:
		return err
	case <-timer.C:
		return c.slowErr()
	case <-ctx.Done():
		return Retryablef("coordinator: %w (the command may still complete)", ctx.Err())
	case <-c.done:
		select {
		case err := <-cmd.reply:
			return err
		default:
			return c.deadErr()
		}
	}
}

func (c *StoreCoordinator) slowErr() error {
	return Retryablef("coordinator: no answer within %v: the store may be slow or unreachable", c.tm.command)
}

func (c *StoreCoordinator) deadErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failure != nil {
		return c.failure
	}
	if c.closed {
		return fmt.Errorf("coordinator: %w: %w", ErrClosed, ErrFatal)
	}
	return Fatalf("coordinator: stopped unexpectedly")
}

// Close stops the actor and hands back, directly, every split it still held
// (bounded by 2×OpTimeout): a lease is deleted only if it still carries this
// process's owner and nonce, an owner is cleared only at this tenancy's
// epoch. On a store with sessions ([Sessioner]) it then closes the lease
// session, so nothing bound to it outlives the process by a TTL. Close is
// idempotent, as every Close in spate is: a later call (Close or Abandon)
// waits for the first to finish and returns nil.
func (c *StoreCoordinator) Close() error {
	if !c.shutdown() {
		return nil
	}
	defer close(c.closedAll)
	if c.act != nil {
		c.directRelease(nil)
		c.act.renew.endSession()
	}
	return nil
}

// Abandon stops the coordinator without handing anything back, as if the
// process had died: its leases expire after a lease and peers take the
// splits over, counting an attempt each. For tests, benchmarks, and a
// store known to be unreachable. Idempotent, like Close.
func (c *StoreCoordinator) Abandon() error {
	if c.shutdown() {
		close(c.closedAll)
	}
	return nil
}

// shutdown stops the actor; first says this call is the first, which
// must close closedAll when its work is done. A later call waits for it.
func (c *StoreCoordinator) shutdown() (first bool) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		<-c.closedAll
		return false
	}
	c.closed = true
	started := c.started
	c.mu.Unlock()
	if started {
		c.stop()
		<-c.done
	}
	return true
}

// handle takes a command the source sent through the handle (commit, fail,
// release, decline, depart) on the loop. Each is taken at once; the store write runs
// beside it (one in flight per split, in order), and the reply goes back
// when the write's answer has been folded into the view.
func (a *actor) handle(cmd *command) error {
	switch cmd.kind {
	case cmdCommit:
		return a.onSplit(cmd.split.id, func() error { return a.startCommit(cmd, false, 0) })
	case cmdFail:
		return a.onSplit(cmd.split.id, func() error { return a.failSplit(cmd) })
	case cmdDivide:
		return a.onSplit(cmd.split.id, func() error { return a.divideSplit(cmd) })
	case cmdRelease, cmdReleaseDrained:
		return a.release(cmd)
	case cmdDecline:
		err := a.decline(cmd.split.id)
		cmd.reply <- nil
		return err
	case cmdDepart:
		a.part()
		cmd.reply <- nil
	}
	return nil
}

// notHeld is the Fenced error of a call for a split this worker does not hold.
func notHeld(id string) error {
	return Fencedf("split %s is not held by this worker; nothing was written", id)
}
