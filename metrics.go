package spate

import (
	"github.com/prometheus/client_golang/prometheus"
)

// coordMetrics are the spate_coordination_* series of one coordinator.
// Gauges have exactly one live owner per coordinator.
type coordMetrics struct {
	splitsOwned       prometheus.Gauge
	splitsCompleted   prometheus.Gauge
	splitsQuarantined prometheus.Gauge
	damaged           prometheus.Gauge
	liveWorkers       prometheus.Gauge
	leader            prometheus.Gauge
	idle              prometheus.Gauge
	splitsDraining    prometheus.Gauge

	acquisitions  *prometheus.CounterVec // reason
	losses        *prometheus.CounterVec // reason
	releases      prometheus.Counter
	revocations   *prometheus.CounterVec // outcome
	planned       prometheus.Counter
	replans       *prometheus.CounterVec // outcome
	failures      prometheus.Counter
	quarantines   prometheus.Counter
	divisions     prometheus.Counter
	pruned        prometheus.Counter
	divisionAsks  prometheus.Counter
	writes        *prometheus.CounterVec // outcome
	writeDur      prometheus.Histogram
	replanDur     prometheus.Histogram
	reconcileDur  prometheus.Histogram
	storeOpDur    *prometheus.HistogramVec // op
	drainDur      prometheus.Histogram
	assignLatency prometheus.Histogram

	// Resolved once: a label lookup hashes and locks on every call, and
	// these are on every store operation and every write.
	ops      map[string]prometheus.Observer
	writesOK prometheus.Counter
}

// opObserver is the store-op duration series for op.
func (m *coordMetrics) opObserver(op string) prometheus.Observer {
	if o, ok := m.ops[op]; ok {
		return o
	}
	return m.storeOpDur.WithLabelValues(op)
}

// durationBuckets span 1 ms to 60 s.
var durationBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

func newCoordMetrics(reg prometheus.Registerer, labels prometheus.Labels) (*coordMetrics, error) {
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: "spate_coordination_" + name, Help: help, ConstLabels: labels})
	}
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "spate_coordination_" + name, Help: help, ConstLabels: labels})
	}
	cv := func(name, help, label string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "spate_coordination_" + name, Help: help, ConstLabels: labels}, []string{label})
	}
	h := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: "spate_coordination_" + name, Help: help, ConstLabels: labels, Buckets: durationBuckets})
	}
	m := &coordMetrics{
		splitsOwned:       g("splits_owned", "Splits this worker holds (its working set)."),
		splitsCompleted:   g("splits_completed", "Completed splits observed fleet-wide."),
		splitsQuarantined: g("splits_quarantined", "Quarantined splits observed fleet-wide; alert on > 0."),
		damaged:           g("records_damaged", "Records of the job this worker cannot read (each takes its split out of play); alert on > 0."),
		liveWorkers:       g("live_workers", "Workers present, this one included."),
		leader:            g("leader", "1 while this worker holds planner leadership."),
		idle:              g("idle", "1 while this worker owns no split."),
		splitsDraining:    g("splits_draining", "Revocation drains in progress, cancelled-but-unfinished ones included."),
		acquisitions:      cv("acquisitions_total", "Split tenancies gained, by how the split was free.", "reason"),
		losses:            cv("split_losses_total", "Tenancies ended involuntarily, by reason.", "reason"),
		releases:          c("releases_total", "Splits handed back gracefully."),
		revocations:       cv("revocations_total", "Revocations on the releasing worker, by outcome.", "outcome"),
		planned:           c("splits_planned_total", "Progress records created while leader."),
		replans:           cv("replans_total", "Planner runs, by outcome.", "outcome"),
		failures:          c("split_failures_total", "Poison reports offered by the source."),
		quarantines:       c("quarantines_total", "Quarantine transitions this worker made."),
		divisions:         c("divisions_total", "Runtime divisions of a running split this worker committed."),
		pruned:            c("splits_pruned_total", "Completed splits whose work is gone deleted from the store while leader."),
		divisionAsks:      c("division_asks_total", "Asks this worker, as leader, made of a split's owner to divide it (the fleet idled)."),
		writes:            cv("writes_total", "Split-record writes, by outcome (conflict = lost compare-and-swap).", "outcome"),
		writeDur:          h("write_duration_seconds", "Split-record write round trip."),
		replanDur:         h("replan_duration_seconds", "One planner run including seeding."),
		reconcileDur:      h("reconcile_duration_seconds", "One reconcile pass."),
		storeOpDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "spate_coordination_store_op_duration_seconds",
			Help: "Store operation latency, by primitive.", ConstLabels: labels, Buckets: durationBuckets}, []string{"op"}),
		drainDur:      h("drain_duration_seconds", "Revocation request to drained hand-back (cooperative completions only)."),
		assignLatency: h("assignment_latency_seconds", "A split first named in this worker's assignment to its lease held."),
	}
	if reg != nil {
		for _, col := range []prometheus.Collector{m.splitsOwned, m.splitsCompleted, m.splitsQuarantined, m.damaged, m.liveWorkers,
			m.leader, m.idle, m.splitsDraining, m.acquisitions, m.losses, m.releases, m.revocations, m.planned,
			m.replans, m.failures, m.quarantines, m.divisions, m.pruned, m.divisionAsks, m.writes, m.writeDur, m.replanDur, m.reconcileDur, m.storeOpDur,
			m.drainDur, m.assignLatency} {
			if err := reg.Register(col); err != nil {
				return nil, Fatalf("registering coordination metrics: %w (give each coordinator in one registry distinct labels with WithMetricLabels)", err)
			}
		}
	}
	// Pre-create the labelled series so dashboards see zeros.
	for _, r := range []string{"create", "reclaimed", "expired", "reassigned"} {
		m.acquisitions.WithLabelValues(r)
	}
	for _, r := range []string{"fenced", "starved", "revoked"} {
		m.losses.WithLabelValues(r)
	}
	for _, r := range []string{"requested", "drained", "forced", "cancelled"} {
		m.revocations.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "error", "noop"} {
		m.replans.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "conflict", "error"} {
		m.writes.WithLabelValues(r)
	}
	m.writesOK = m.writes.WithLabelValues("ok")
	m.ops = map[string]prometheus.Observer{}
	for _, op := range []string{"put", "get", "delete", "list", "watch"} {
		m.ops[op] = m.storeOpDur.WithLabelValues(op)
	}
	return m, nil
}
