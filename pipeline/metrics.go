package pipeline

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// pipelineVersion is reported by spate_pipeline_info.
const pipelineVersion = "0.1.0"

// durationBuckets are the buckets of every *_duration_seconds histogram:
// 1 ms to 60 s.
var durationBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// pipelineState is the one-hot value of spate_pipeline_state.
type pipelineState uint8

const (
	stateStarting pipelineState = iota
	stateRunning
	stateDraining
	stateFailed
)

func (s pipelineState) String() string {
	return [...]string{"starting", "running", "draining", "failed"}[s]
}

// metrics holds every series the runtime publishes. With a nil registerer
// the collectors exist but are never exported, so the record path is the
// same either way. Standard labels: pipeline (constant), component and
// component_type.
type metrics struct {
	info, state, threads *prometheus.GaugeVec

	pendingBatches, partitionPending, watermarkAge *prometheus.GaugeVec
	commits                                        *prometheus.CounterVec
	commitDuration                                 *prometheus.HistogramVec

	rebalances                *prometheus.CounterVec
	lanesActive, lag          *prometheus.GaugeVec
	records, bytes            *prometheus.CounterVec
	pollDuration              *prometheus.HistogramVec
	bpPaused, inflight        *prometheus.GaugeVec
	bpPausedSeconds, bpEvents *prometheus.CounterVec

	queueDepth                                              *prometheus.GaugeVec
	queueFull, sinkBatches, sinkAbandoned, sinkDrainOverrun *prometheus.CounterVec
	sinkRetries, sinkRecords                                *prometheus.CounterVec
	sinkWriteDuration                                       *prometheus.HistogramVec
	recordErrors                                            *prometheus.CounterVec
}

func newMetrics(pipeline string, reg prometheus.Registerer) (*metrics, error) {
	cl := prometheus.Labels{"pipeline": pipeline}
	std := []string{"component", "component_type"}
	g := func(name, help string, extra ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: cl}, append(std[:2:2], extra...))
	}
	c := func(name, help string, extra ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: cl}, append(std[:2:2], extra...))
	}
	h := func(name, help string, extra ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: cl, Buckets: durationBuckets}, append(std[:2:2], extra...))
	}
	m := &metrics{
		info:              g("spate_pipeline_info", "Pipeline build information; always 1.", "version"),
		state:             g("spate_pipeline_state", "Pipeline state, one-hot.", "state"),
		threads:           g("spate_pipeline_threads", "Runner goroutines."),
		pendingBatches:    g("spate_checkpoint_pending_batches", "Largest count of registered, not yet committed-past batches over partitions."),
		partitionPending:  g("spate_checkpoint_partition_pending_batches", "Pending batches per partition (per-partition detail only).", "partition"),
		watermarkAge:      g("spate_checkpoint_watermark_age_seconds", "Longest time a partition watermark has been stalled behind a failed batch."),
		commits:           c("spate_checkpoint_commits_total", "Source commit calls by outcome.", "outcome"),
		commitDuration:    h("spate_checkpoint_commit_duration_seconds", "Source commit call duration."),
		rebalances:        c("spate_source_rebalances_total", "Assignments and revocations.", "event"),
		lanesActive:       g("spate_source_lanes_active", "Lanes assigned to the pipeline."),
		lag:               g("spate_source_lag_records", "Source-reported lag per partition.", "partition"),
		records:           c("spate_source_records_total", "Records polled."),
		bytes:             c("spate_source_bytes_total", "Payload bytes polled (value plus key)."),
		pollDuration:      h("spate_source_poll_duration_seconds", "Lane poll duration."),
		bpPaused:          g("spate_backpressure_paused", "1 while the runner is paused by backpressure."),
		bpPausedSeconds:   c("spate_backpressure_paused_seconds_total", "Time spent paused by backpressure."),
		bpEvents:          c("spate_backpressure_pause_events_total", "Backpressure pauses."),
		inflight:          g("spate_backpressure_inflight_bytes", "Bytes sealed into chunks and not yet settled by a sink."),
		queueDepth:        g("spate_queue_depth", "Chunks queued per sink shard.", "shard"),
		queueFull:         c("spate_queue_full_events_total", "Chunk sends refused by a full shard queue."),
		sinkBatches:       c("spate_sink_batches_total", "Sink batches by outcome.", "outcome"),
		sinkRecords:       c("spate_sink_records_total", "Records written durably."),
		sinkAbandoned:     c("spate_sink_abandoned_batches_total", "Sink batches abandoned (their acknowledgments failed)."),
		sinkDrainOverrun:  c("spate_sink_drain_overrun_total", "Sink drains that hit their deadline."),
		sinkRetries:       c("spate_sink_retries_total", "Sink write retries."),
		sinkWriteDuration: h("spate_sink_write_duration_seconds", "Sink write duration, retries excluded."),
		recordErrors:      c("spate_transform_record_errors_total", "Records a stage failed on, by policy (skip drops the record, fail stops the pipeline).", "stage", "policy"),
	}
	if reg == nil {
		return m, nil
	}
	for _, col := range []prometheus.Collector{
		m.info, m.state, m.threads, m.pendingBatches, m.partitionPending, m.watermarkAge,
		m.commits, m.commitDuration, m.rebalances, m.lanesActive, m.lag, m.records, m.bytes,
		m.pollDuration, m.bpPaused, m.bpPausedSeconds, m.bpEvents, m.inflight, m.queueDepth,
		m.queueFull, m.sinkBatches, m.sinkRecords, m.sinkAbandoned, m.sinkDrainOverrun, m.sinkRetries,
		m.sinkWriteDuration, m.recordErrors,
	} {
		if err := reg.Register(col); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("pipeline %q: metrics already registered (one registry per pipeline): %w", pipeline, err)
			}
			return nil, fmt.Errorf("pipeline %q: register metrics: %w", pipeline, err)
		}
	}
	return m, nil
}

const (
	compPipeline = "pipeline"
	compCheck    = "checkpoint"
	compSource   = "source"
)

func (m *metrics) setState(s pipelineState) {
	for st := stateStarting; st <= stateFailed; st++ {
		v := 0.0
		if st == s {
			v = 1
		}
		m.state.WithLabelValues(compPipeline, compPipeline, st.String()).Set(v)
	}
}

func (m *metrics) commit(ok bool, d time.Duration) {
	outcome := "ok"
	if !ok {
		outcome = "error"
	}
	m.commits.WithLabelValues(compCheck, compCheck, outcome).Inc()
	m.commitDuration.WithLabelValues(compCheck, compCheck).Observe(d.Seconds())
}

// runnerMetrics are one runner's handles, resolved once at start.
type runnerMetrics struct {
	records, bytes, pausedSeconds, pauseEvents prometheus.Counter
	paused                                     prometheus.Gauge
	poll                                       prometheus.Observer
}

func (m *metrics) forRunner(i int) runnerMetrics {
	comp := "runner-" + strconv.Itoa(i)
	return runnerMetrics{
		records:       m.records.WithLabelValues(compSource, compSource),
		bytes:         m.bytes.WithLabelValues(compSource, compSource),
		poll:          m.pollDuration.WithLabelValues(compSource, compSource),
		paused:        m.bpPaused.WithLabelValues(comp, "runner"),
		pausedSeconds: m.bpPausedSeconds.WithLabelValues(comp, "runner"),
		pauseEvents:   m.bpEvents.WithLabelValues(comp, "runner"),
	}
}

// sourceMetrics is the handle a source publishes its own measurements
// through (the runtime records everything else).
type sourceMetrics struct {
	m             *metrics
	componentType string
}

// SetLag publishes a partition's lag in records.
func (s *sourceMetrics) SetLag(p PartitionID, records int64) {
	if s == nil {
		return
	}
	s.m.lag.WithLabelValues(compSource, s.componentType, strconv.FormatUint(uint64(p), 10)).Set(float64(records))
}

// DeleteLag removes a partition's lag series (the partition left).
func (s *sourceMetrics) DeleteLag(p PartitionID) {
	if s == nil {
		return
	}
	s.m.lag.DeleteLabelValues(compSource, s.componentType, strconv.FormatUint(uint64(p), 10))
}
