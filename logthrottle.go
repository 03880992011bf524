package spate

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// warnEvery is how often one warning message may reach the log. A store
// that refuses writes for a minute makes the same warning for every split
// and every retry; the operator needs to see it, and how often it
// happened, not thousands of copies.
const warnEvery = 10 * time.Second

// warnBurst is how many copies of one warning pass per window, so that a
// few splits lost together are each named.
const warnBurst = 5

// throttle is a slog.Handler that passes each distinct warning message at
// most warnBurst times per window, adding "suppressed" (how many copies it
// held back since the last one it passed) when it passes the next. Records below
// Warn and at Error or above pass untouched. Copies made by WithAttrs and
// WithGroup share the count, so "split" attributes bound in do not make a
// message distinct.
type throttle struct {
	next   slog.Handler
	window time.Duration
	st     *throttleState
}

type throttleState struct {
	mu   sync.Mutex
	seen map[string]*throttled
}

type throttled struct {
	start      time.Time // the current window's start
	passed     int       // copies passed in it
	suppressed int       // copies held back since the last one passed
}

func newThrottle(next slog.Handler, window time.Duration) *throttle {
	return &throttle{next: next, window: window, st: &throttleState{seen: map[string]*throttled{}}}
}

func (h *throttle) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *throttle) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn || r.Level >= slog.LevelError {
		return h.next.Handle(ctx, r)
	}
	now := time.Now()
	h.st.mu.Lock()
	t := h.st.seen[r.Message]
	if t == nil {
		if len(h.st.seen) > 1024 {
			clear(h.st.seen) // messages are constant strings; this is a guard
		}
		t = &throttled{}
		h.st.seen[r.Message] = t
	}
	if now.Sub(t.start) >= h.window {
		t.start, t.passed = now, 0
	}
	if t.passed >= warnBurst {
		t.suppressed++
		h.st.mu.Unlock()
		return nil
	}
	n := t.suppressed
	t.passed++
	t.suppressed = 0
	h.st.mu.Unlock()
	if n > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("suppressed", n))
	}
	return h.next.Handle(ctx, r)
}

func (h *throttle) WithAttrs(as []slog.Attr) slog.Handler {
	return &throttle{next: h.next.WithAttrs(as), window: h.window, st: h.st}
}

func (h *throttle) WithGroup(name string) slog.Handler {
	return &throttle{next: h.next.WithGroup(name), window: h.window, st: h.st}
}
