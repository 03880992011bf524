package pipeline

import (
	"errors"
	"fmt"
	"time"
)

// Defaults of [Config].
const (
	defaultCommitInterval    = 5 * time.Second
	defaultMaxPendingBatches = 1024
	// defaultMaxUncommittedBytes is the per-partition ceiling of bytes
	// polled and not yet committed (64 MiB).
	defaultMaxUncommittedBytes = 64 << 20
	defaultDrainTimeout        = 25 * time.Second
	defaultStalledFailAfter    = 120 * time.Second
	defaultMaxInflightBytes    = 256 << 20
	defaultHighRatio           = 0.8
	defaultLowRatio            = 0.5
	defaultMinPause            = 500 * time.Millisecond
	defaultMaxRecords          = 512
	defaultPollTimeout         = 10 * time.Millisecond
	defaultIdleFlush           = 100 * time.Millisecond
	defaultBlockedRetry        = 2 * time.Millisecond
	defaultBlockGrace          = 10 * time.Millisecond
	defaultEventPollTimeout    = 50 * time.Millisecond
	// defaultStopReserve is how long before the drain deadline a graceful
	// stop's reading ends.
	defaultStopReserve = 5 * time.Second
	// defaultCloseShare is the part of the drain deadline kept for the
	// source's close when it has one.
	defaultCloseShare = time.Second
	// fastCommitPoll is the controller's cadence while a partition that
	// reached end of input is chased.
	fastCommitPoll = time.Millisecond
)

// Config holds a pipeline's knobs. A zero field takes its default.
type Config struct {
	// Name labels the pipeline's metrics. Required.
	Name string
	// Threads is the number of runner goroutines. Default 1.
	Threads int
	// CommitInterval is the commit tick. Default 5s.
	CommitInterval time.Duration
	// ChaseWindow bounds each end-of-input partition's fast-commit chase.
	// Default CommitInterval.
	ChaseWindow time.Duration
	// MaxPendingBatches is the hard per-partition ceiling of batches polled
	// and not yet committed past. Default 1024.
	MaxPendingBatches int
	// MaxUncommittedBytes is the per-partition ceiling of payload bytes
	// polled whose watermark the source has not yet committed (a commit
	// that failed or was deferred does not count). A partition at it is not
	// polled, exactly like one at MaxPendingBatches, until a commit lands,
	// so a store that refuses commits stops the reading after a bounded
	// amount instead of letting everything read since the last commit
	// replay. A partition reaching it asks the controller for an early
	// commit, so a working store does not throttle a fast source to one
	// ceiling per commit tick. Default 64 MiB; negative disables it.
	// Unless it is disabled, while commits are not landing at all, a
	// partition with anything uncommitted is not polled either.
	MaxUncommittedBytes int64
	// DrainTimeout bounds a revocation drain and the whole shutdown drain
	// (counted from the stop's trigger). Default 25s; keep it below the
	// orchestrator's grace period.
	DrainTimeout time.Duration
	// StalledFailAfter fails the pipeline once a partition's watermark has
	// been stuck behind a failed batch this long. Default 120s.
	StalledFailAfter time.Duration
	// MaxInflightBytes is the in-flight byte budget. Default 256 MiB.
	MaxInflightBytes int64
	// HighRatio and LowRatio are the pause and resume marks as fractions of
	// the budget (and LowRatio of queue capacity). Defaults 0.8 and 0.5.
	HighRatio, LowRatio float64
	// MinPause is the shortest backpressure pause. Default 500ms.
	MinPause time.Duration
	// MaxRecords is the most records one lane poll returns. Default 512.
	MaxRecords int
	// PollTimeout is a lane poll's wait when every lane was idle, and the
	// runners' park and pause step. Default 10ms.
	PollTimeout time.Duration
	// IdleFlush flushes a chain this long after its last data, or after
	// its first data since the last flush. Default 100ms.
	IdleFlush time.Duration
	// BlockedRetry is the wait between pushes of a blocked batch. Default 2ms.
	// A chain that can wait for its full sink queue to take a chunk (the
	// runtime's own) retries as soon as it does, within this wait.
	BlockedRetry time.Duration
	// BlockGrace is how long a batch may wait on a full sink queue before
	// the runner counts the refusal as backpressure and pauses the source
	// (which then lasts at least MinPause). While it waits the runner
	// polls nothing, and it pushes again the moment the queue takes a
	// chunk, so a momentarily full queue costs that moment, not a pause.
	// It applies to the runtime's chains; a chain that cannot wait for room
	// pauses the source on its first refusal, as does a negative grace.
	// Default 10ms.
	BlockGrace time.Duration
	// EventPollTimeout bounds the controller's PollEvents wait. Default 50ms.
	EventPollTimeout time.Duration
	// StopReserve: a graceful stop reads on until this long before its
	// drain deadline. Default 5s.
	StopReserve time.Duration
	// CloseShare is kept from the drain deadline for the source's
	// Close. Default 1s (zero for sources without Close).
	CloseShare time.Duration
	// PerPartitionDetail publishes per-partition pending gauges.
	PerPartitionDetail bool
}

// WithDefaults returns c with every zero field defaulted.
func (c Config) WithDefaults() Config {
	d := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	if c.Threads == 0 {
		c.Threads = 1
	}
	d(&c.CommitInterval, defaultCommitInterval)
	d(&c.ChaseWindow, c.CommitInterval)
	if c.MaxPendingBatches == 0 {
		c.MaxPendingBatches = defaultMaxPendingBatches
	}
	if c.MaxUncommittedBytes == 0 {
		c.MaxUncommittedBytes = defaultMaxUncommittedBytes
	}
	d(&c.DrainTimeout, defaultDrainTimeout)
	d(&c.StalledFailAfter, defaultStalledFailAfter)
	if c.MaxInflightBytes == 0 {
		c.MaxInflightBytes = defaultMaxInflightBytes
	}
	if c.HighRatio == 0 {
		c.HighRatio = defaultHighRatio
	}
	if c.LowRatio == 0 {
		c.LowRatio = defaultLowRatio
	}
	d(&c.MinPause, defaultMinPause)
	if c.MaxRecords == 0 {
		c.MaxRecords = defaultMaxRecords
	}
	d(&c.PollTimeout, defaultPollTimeout)
	d(&c.IdleFlush, defaultIdleFlush)
	d(&c.BlockedRetry, defaultBlockedRetry)
	d(&c.BlockGrace, defaultBlockGrace)
	d(&c.EventPollTimeout, defaultEventPollTimeout)
	d(&c.StopReserve, defaultStopReserve)
	d(&c.CloseShare, defaultCloseShare)
	return c
}

// Validate checks c with defaults applied and returns every violation.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	rule := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("pipeline config: "+format, args...))
		}
	}
	rule(c.Name != "", "name is required")
	rule(c.Threads >= 1, "threads must be >= 1, got %d", c.Threads)
	rule(c.CommitInterval > 0, "commit interval must be positive, got %v", c.CommitInterval)
	rule(c.MaxPendingBatches >= 1, "max pending batches must be >= 1, got %d", c.MaxPendingBatches)
	rule(c.DrainTimeout > 0, "drain timeout must be positive, got %v", c.DrainTimeout)
	rule(c.StalledFailAfter > 0, "stalled-fail-after must be positive, got %v", c.StalledFailAfter)
	rule(c.MaxInflightBytes > 0, "max in-flight bytes must be positive, got %d", c.MaxInflightBytes)
	rule(0 < c.LowRatio && c.LowRatio < c.HighRatio && c.HighRatio <= 1,
		"backpressure ratios need 0 < low < high <= 1, got low %v high %v", c.LowRatio, c.HighRatio)
	rule(c.MaxRecords >= 1, "max records must be >= 1, got %d", c.MaxRecords)
	rule(c.StopReserve >= 0 && c.CloseShare >= 0, "stop reserve and close share must not be negative")
	return errors.Join(errs...)
}
