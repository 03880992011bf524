package pipeline

import (
	"net/http"
	"sync/atomic"
	"time"
)

// Health thresholds: a runner heartbeat older than HeartbeatStale, or a
// watermark stalled for longer than WatermarkStuck while data is flowing,
// fails liveness.
const (
	HeartbeatStale = 30 * time.Second
	WatermarkStuck = 300 * time.Second
)

// HealthState is the pipeline's liveness and readiness, kept in atomics.
type HealthState struct {
	start       time.Time
	beats       []atomic.Int64 // ms since start, per runner
	assigned    atomic.Bool
	sinksOK     atomic.Bool
	watermarkMs atomic.Int64
	flowing     atomic.Bool
	now         func() time.Time
}

func newHealthState(threads int, now func() time.Time) *HealthState {
	if now == nil {
		now = time.Now
	}
	return &HealthState{start: now(), beats: make([]atomic.Int64, threads), now: now}
}

func (h *HealthState) elapsedMs() int64 { return h.now().Sub(h.start).Milliseconds() }

// beat records a heartbeat of runner i.
func (h *HealthState) beat(i int) { h.beats[i].Store(h.elapsedMs()) }

func (h *HealthState) setAssignmentReceived() { h.assigned.Store(true) }

func (h *HealthState) setSinksConnected(ok bool) { h.sinksOK.Store(ok) }

func (h *HealthState) reportWatermark(age time.Duration, flowing bool) {
	h.watermarkMs.Store(age.Milliseconds())
	h.flowing.Store(flowing)
}

// Ready reports whether an assignment arrived and the sinks are connected.
func (h *HealthState) Ready() bool { return h.assigned.Load() && h.sinksOK.Load() }

// Live reports whether every runner beat recently and no watermark is
// stuck while data flows.
func (h *HealthState) Live() bool {
	now := h.elapsedMs()
	for i := range h.beats {
		if time.Duration(now-h.beats[i].Load())*time.Millisecond > HeartbeatStale {
			return false
		}
	}
	stuck := h.flowing.Load() && time.Duration(h.watermarkMs.Load())*time.Millisecond > WatermarkStuck
	return !stuck
}

// Handler serves GET /healthz (liveness) and /readyz (readiness), and
// /metrics when metrics is non-nil; other paths are 404 and other methods
// 405.
func (h *HealthState) Handler(metrics http.Handler) http.Handler {
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
