package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ExitState is how a run ended.
type ExitState uint8

const (
	// Completed: the source drained (its input ended: a bounded job is
	// done) and every record was acknowledged and committed.
	Completed ExitState = iota
	// Failed: a component failed; see [ExitReport.Failure].
	Failed
	// Stopped: a stop ([Runtime.Stop], a cancelled context, a signal)
	// ended the run cleanly before the input ended: what was read was
	// committed, and the rest is left for a later run (a coordinated
	// source hands its splits back).
	Stopped
)

func (s ExitState) String() string {
	switch s {
	case Completed:
		return "completed"
	case Stopped:
		return "stopped"
	}
	return "failed"
}

// ExitReport is the outcome of [Runtime.Run].
type ExitReport struct {
	State ExitState
	// Failure is the first fatal error, nil unless Failed.
	Failure *FatalError
	// SinkDrain is what the sink drain did (nil if it never ran).
	SinkDrain *DrainReport
	// FinalWatermarks are the last committed positions of the partitions
	// still assigned at the end, sorted by partition.
	FinalWatermarks []Watermark
	// UnresolvedAcks counts acknowledgment handles never released: a leak
	// in a lane, chain or sink. It is zero for a correct pipeline.
	UnresolvedAcks int64
}

// ExitCode is 0 for Completed and Stopped and 1 for Failed.
func (r ExitReport) ExitCode() int {
	if r.State != Failed {
		return 0
	}
	return 1
}

// Err is the failure as an error, nil unless Failed.
func (r ExitReport) Err() error {
	if r.Failure == nil {
		return nil
	}
	return r.Failure
}

// Option configures a [Runtime].
type Option func(*runtimeOptions)

type runtimeOptions struct {
	log *slog.Logger
	reg prometheus.Registerer
}

// WithLogger sets the logger (slog.Default by default).
func WithLogger(l *slog.Logger) Option { return func(o *runtimeOptions) { o.log = l } }

// WithRegisterer registers the pipeline's metrics on reg (none by default).
// Use one registry per pipeline: a duplicate registration fails Build.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(o *runtimeOptions) { o.reg = reg }
}

// Runtime runs one pipeline: a controller goroutine that alone drives the
// [Source], Threads runner goroutines that poll lanes through their chains,
// and the sinks' writers.
type Runtime struct {
	cfg    Config
	src    Source
	chains chainFactory
	sinks  sinkHooks
	budget *inflightBudget
	m      *metrics
	log    *slog.Logger
	health *healthState
	stop   *stopRequest
	ran    atomic.Bool
}

// newRuntime assembles a runtime from a source, a chain per runner and the sinks'
// hooks. budget is shared with the sinks (nil: a fresh one of
// MaxInflightBytes). Nothing starts until Run.
func newRuntime(cfg Config, src Source, chains chainFactory, sinks sinkHooks, budget *inflightBudget, opts ...Option) (*Runtime, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	if src == nil || chains == nil {
		return nil, errors.New("pipeline: a source and a chain factory are required")
	}
	o := runtimeOptions{log: slog.Default()}
	for _, opt := range opts {
		opt(&o)
	}
	m, err := newMetrics(cfg.Name, o.reg)
	if err != nil {
		return nil, err
	}
	if budget == nil {
		budget = newInflightBudget(cfg.MaxInflightBytes)
	}
	if sinks.QueuesBelow == nil {
		sinks.QueuesBelow = func(float64) bool { return true }
	}
	return &Runtime{
		cfg: cfg, src: src, chains: chains, sinks: sinks, budget: budget, m: m,
		log:    o.log.With("pipeline", cfg.Name),
		health: newHealthState(cfg.Threads, nil),
		stop:   newStopRequest(),
	}, nil
}

// SinkSpec names a sink for [Build].
type SinkSpec struct {
	Name    string
	Sink    Sink
	Options SinkOptions
}

// Build assembles a runtime whose chains run stages and fan every record
// out to each sink. A [StagingSink] among sinks is wired to src, which must
// then carry its committables ([CoordinatedSource] does).
func Build(cfg Config, src Source, stages []Stage, sinks []SinkSpec, opts ...Option) (*Runtime, error) {
	if err := wireStaging(src, sinks); err != nil {
		return nil, err
	}
	budget := newInflightBudget(cfg.WithDefaults().MaxInflightBytes)
	rts := make([]*sinkRuntime, len(sinks))
	for i, s := range sinks {
		rts[i] = newSinkRuntime(s.Name, s.Sink, s.Options, budget)
	}
	return newRuntime(cfg, src, newChainFactory(stages, rts...), newSinkHooks(rts...), budget, opts...)
}

// Budget is the in-flight byte budget shared with the sinks.
func (r *Runtime) Budget() *inflightBudget { return r.budget }

// Handler serves /healthz and /readyz, and /metrics when metrics is non-nil
// (for instance promhttp.HandlerFor(registry, ...)).
func (r *Runtime) Handler(metrics http.Handler) http.Handler { return r.health.Handler(metrics) }

// Stop triggers a graceful stop, like cancelling Run's context. It is
// idempotent and never blocks.
func (r *Runtime) Stop() { r.stop.trigger(time.Now()) }

// Run runs the pipeline until a stop (Stop or ctx cancelled: a graceful
// drain), a drained source, or a failure, and reports how it ended. The
// returned error is the report's failure. Run may be called once.
func (r *Runtime) Run(ctx context.Context) (ExitReport, error) {
	if !r.ran.CompareAndSwap(false, true) {
		return ExitReport{State: Failed, Failure: fatalf("runtime", "Run called twice")}, errors.New("pipeline: Run called twice")
	}
	unwatch := context.AfterFunc(ctx, func() { r.stop.trigger(time.Now()) })
	defer unwatch()

	m := r.m
	m.info.WithLabelValues(compPipeline, compPipeline, pipelineVersion).Set(1)
	m.threads.WithLabelValues(compPipeline, compPipeline).Set(float64(r.cfg.Threads))
	m.setState(stateStarting)

	if r.sinks.start != nil {
		r.sinks.start(m, r.log)
	}
	defer r.startProbe()()

	s := &runState{
		cp:             NewCheckpointer(nil),
		shutdown:       new(atomic.Bool),
		commitsFailing: new(atomic.Bool),
		events:         newMPSC[runnerEvent](),
		toMain:         make(chan controllerSignal, 2),
		sinkDrained:    make(chan struct{}, 1),
		controllerDone: make(chan struct{}),
	}
	r.startRunners(s)
	r.startController(s)
	finished := r.awaitController(s)
	if finished == nil {
		return r.controllerDied(s)
	}
	return r.finish(s, finished)
}

// runState is what the phases of one [Runtime.Run] share: the runners, the
// controller, and the report being made.
type runState struct {
	cp             *Checkpointer
	shutdown       *atomic.Bool
	commitsFailing *atomic.Bool
	events         *mpsc[runnerEvent]
	controls       []*mpsc[controlMsg]
	exits          []runnerExit
	runners        sync.WaitGroup

	toMain          chan controllerSignal
	sinkDrained     chan struct{}
	controllerDone  chan struct{}
	controllerPanic atomic.Pointer[string]

	report  ExitReport
	sinkRan bool // the sinks' Drain ran (at most once)
}

// startProbe starts the sinks' connectivity probe, if they have one;
// the returned function stops it and waits for it.
func (r *Runtime) startProbe() (stop func()) {
	probeDone := make(chan struct{})
	probeStop := make(chan struct{})
	if r.sinks.Probe == nil {
		r.health.setSinksConnected(true)
		close(probeDone)
	} else {
		go r.probeLoop(probeStop, probeDone)
	}
	return func() { close(probeStop); <-probeDone }
}

// startRunners starts one runner goroutine per thread, each with its own
// control queue.
func (r *Runtime) startRunners(s *runState) {
	cfg := r.cfg
	s.controls = make([]*mpsc[controlMsg], cfg.Threads)
	s.exits = make([]runnerExit, cfg.Threads)
	params := newBPParams(r.budget.Max(), cfg.HighRatio, cfg.LowRatio, cfg.MinPause)
	for i := range cfg.Threads {
		s.controls[i] = newMPSC[controlMsg]()
		rn := &runner{
			i: i, cfg: &r.cfg, ctl: s.controls[i], events: s.events, chain: r.chains(i),
			bp: newWatermarkController(params, nil), budget: r.budget, queuesBelow: r.sinks.QueuesBelow,
			health: r.health, shutdown: s.shutdown, commitsFailing: s.commitsFailing, m: r.m.forRunner(i), component: fmt.Sprintf("runner-%d", i),
			log: r.log.With("component", fmt.Sprintf("runner-%d", i)), gates: map[PartitionID]*gateState{},
		}
		s.runners.Go(func() { s.exits[i] = rn.run() })
	}
}

// startController starts the controller goroutine; a panic in it is kept
// for the report, and controllerDone closes when it returns.
func (r *Runtime) startController(s *runState) {
	cfg := r.cfg
	closeShare := time.Duration(0)
	if _, ok := r.src.(sourceCloser); ok {
		closeShare = cfg.CloseShare
	}
	c := &controller{
		cfg: cfg, src: r.src, cp: s.cp, controls: s.controls, events: s.events, toMain: s.toMain,
		sinkDrained: s.sinkDrained, stop: r.stop, shutdown: s.shutdown, commitsFailing: s.commitsFailing, stopNow: time.Now, now: time.Now,
		closeShare: closeShare, health: r.health, m: r.m, budget: r.budget,
		srcMetrics: &sourceMetrics{m: r.m, componentType: compSource}, failures: r.sinks.Failures,
		sinkFatal: r.sinks.Fatal,
		log:       r.log.With("component", "controller"),
	}
	go func() {
		defer close(s.controllerDone)
		defer func() {
			if p := recover(); p != nil {
				why := fmt.Sprint(p)
				s.controllerPanic.Store(&why)
			}
		}()
		c.run()
	}()
}

// drainSinks runs the sinks' Drain once, by deadline.
func (r *Runtime) drainSinks(s *runState, deadline time.Time) {
	if s.sinkRan {
		return
	}
	s.sinkRan = true
	if r.sinks.Drain == nil {
		s.report.SinkDrain = &DrainReport{}
		return
	}
	dctx, cancel := context.WithDeadline(context.Background(), deadline)
	d := r.sinks.Drain(dctx)
	cancel()
	s.report.SinkDrain = &d
}

// awaitController serves the controller's signals until it reports the
// end of the run, draining the sinks when it says the lanes have drained;
// nil when the controller died without a report.
func (r *Runtime) awaitController(s *runState) *controllerReport {
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for {
		select {
		case sig := <-s.toMain:
			if sig.lanesDrained {
				s.runners.Wait()
				r.drainSinks(s, sig.sinkDeadline)
				s.sinkDrained <- struct{}{}
				continue
			}
			return sig.finished
		case <-s.controllerDone:
			select {
			case sig := <-s.toMain:
				if sig.finished != nil {
					return sig.finished
				}
				if sig.lanesDrained {
					s.runners.Wait()
					r.drainSinks(s, sig.sinkDeadline)
				}
			default:
			}
			return nil
		case <-ticker.C:
		}
	}
}

// controllerDied stops the runners and drains the sinks in the
// controller's place, and reports the run Failed.
func (r *Runtime) controllerDied(s *runState) (ExitReport, error) {
	cfg := r.cfg
	why := "controller thread panicked"
	if p := s.controllerPanic.Load(); p != nil {
		why += ": " + *p
	}
	r.log.Error(why)
	s.shutdown.Store(true)
	deadline := time.Now().Add(cfg.DrainTimeout)
	b := newDrainBarrier(cfg.Threads)
	for _, q := range s.controls {
		q.Push(controlMsg{kind: ctlShutdown, barrier: b, deadline: deadline})
	}
	s.runners.Wait()
	r.drainSinks(s, time.Now().Add(cfg.DrainTimeout))
	r.m.setState(stateFailed)
	report := &s.report
	report.State = Failed
	report.Failure = &FatalError{Component: "controller", Reason: why}
	report.UnresolvedAcks = s.cp.Unresolved()
	r.closeSource(time.Now().Add(cfg.CloseShare))
	return *report, report.Failure
}

// finish waits for the runners and the controller after its report,
// closes the source and makes the run's report.
func (r *Runtime) finish(s *runState, finished *controllerReport) (ExitReport, error) {
	s.runners.Wait()
	<-s.controllerDone
	report := &s.report
	if finished.failure != nil {
		report.State = Failed
		report.Failure = finished.failure
	} else if !finished.drained {
		report.State = Stopped
	}
	if report.State != Failed {
		for _, e := range s.exits {
			if e.panic != nil {
				report.State = Failed
				report.Failure = e.panic
				r.m.setState(stateFailed)
				break
			}
		}
	}
	if !s.sinkRan && r.sinks.Stop != nil {
		r.sinks.Stop()
	}
	report.FinalWatermarks = finished.finalWatermarks
	r.closeSource(finished.closeBy)
	report.UnresolvedAcks = s.cp.Unresolved()
	if report.UnresolvedAcks > 0 {
		r.log.Error("acknowledgment handles were never released (a leak in a lane, chain or sink)", "unresolved", report.UnresolvedAcks)
	}
	return *report, report.Err()
}

func (r *Runtime) closeSource(by time.Time) {
	cl, ok := r.src.(sourceCloser)
	if !ok {
		return
	}
	if time.Until(by) < 100*time.Millisecond {
		by = time.Now().Add(100 * time.Millisecond)
	}
	ctx, cancel := context.WithDeadline(context.Background(), by)
	defer cancel()
	if err := cl.Close(ctx); err != nil {
		r.log.Warn("source close failed", "error", err)
	}
}

// probeLoop probes the sinks: every 30s while connected, every 5s while
// failing.
func (r *Runtime) probeLoop(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := r.sinks.Probe(ctx)
		cancel()
		r.health.setSinksConnected(err == nil)
		wait := 30 * time.Second
		if err != nil {
			r.log.Warn("sink probe failed", "error", err)
			wait = 5 * time.Second
		}
		t := time.NewTimer(wait)
		select {
		case <-stop:
			t.Stop()
			return
		case <-t.C:
		}
	}
}
