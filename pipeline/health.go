package pipeline

import (
	"net/http"
	"sync/atomic"
	"time"
)

// Health thresholds: a runner heartbeat older than heartbeatStale, or a
// watermark stalled for longer than watermarkStuck while data is flowing,
// fails liveness.
const (
	heartbeatStale = 30 * time.Second
	watermarkStuck = 300 * time.Second
)

// healthState is the pipeline's liveness and readiness, kept in atomics.
type healthState struct {
	start       time.Time
	beats       []atomic.Int64 // ms since start, per runner
	assigned    atomic.Bool
	sinksOK     atomic.Bool
	watermarkMs atomic.Int64
	flowing     atomic.Bool
	now         func() time.Time
}

func newHealthState(threads int, now func() time.Time) *healthState {
	if now == nil {
		now = time.Now
	}
	return &healthState{start: now(), beats: make([]atomic.Int64, threads), now: now}
}

func (h *healthState) elapsedMs() int64 { return h.now().Sub(h.start).Milliseconds() }

// beat records a heartbeat of runner i.
func (h *healthState) beat(i int) { h.beats[i].Store(h.elapsedMs()) }

func (h *healthState) setAssignmentReceived() { h.assigned.Store(true) }

func (h *healthState) setSinksConnected(ok bool) { h.sinksOK.Store(ok) }

func (h *healthState) reportWatermark(age time.Duration, flowing bool) {
	h.watermarkMs.Store(age.Milliseconds())
	h.flowing.Store(flowing)
}

// Ready reports whether an assignment arrived and the sinks are connected.
func (h *healthState) Ready() bool { return h.assigned.Load() && h.sinksOK.Load() }

// Live reports whether every runner beat recently and no watermark is
// stuck while data flows.
func (h *healthState) Live() bool {
	now := h.elapsedMs()
	for i := range h.beats {
		if time.Duration(now-h.beats[i].Load())*time.Millisecond > heartbeatStale {
			return false
		}
	}
	stuck := h.flowing.Load() && time.Duration(h.watermarkMs.Load())*time.Millisecond > watermarkStuck
	return !stuck
}

// Handler serves GET /healthz (liveness) and /readyz (readiness), and
// /metrics when metrics is non-nil; other paths are 404 and other methods
// 405.
func (h *healthState) Handler(metrics http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ok bool
		switch r.URL.Path {
		case "/healthz":
			ok = h.Live()
		case "/readyz":
			ok = h.Ready()
		case "/metrics":
			if metrics == nil {
				http.NotFound(w, r)
				return
			}
			if r.Method != http.MethodGet {
				http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
				return
			}
			metrics.ServeHTTP(w, r)
			return
		default:
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if ok {
			_, _ = w.Write([]byte("ok\n"))
			return
		}
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
	})
}
