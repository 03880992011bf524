package conformance_test

import (
	"context"
	"testing"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/stores/mem"
)

// laggingDurable is the in-memory store whose watches of the durable
// keyspace deliver each event lag after it happened, as a peer's watch of
// that keyspace does on a loaded machine when the two keyspaces are
// watched apart (stores/etcd): it sees a release's lease delete before
// the release's owner-clear.
type laggingDurable struct {
	*mem.Store
	lag time.Duration
}

func (s *laggingDurable) Watch(ctx context.Context, ks spate.Keyspace, prefix string) (<-chan spate.WatchEvent, error) {
	ch, err := s.Store.Watch(ctx, ks, prefix)
	if err != nil || ks != spate.Durable {
		return ch, err
	}
	return s.delay(ctx, ch), nil
}

func (s *laggingDurable) WatchKeys(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
	ch, err := s.Store.WatchKeys(ctx, ks, keys)
	if err != nil || ks != spate.Durable {
		return ch, err
	}
	return s.delay(ctx, ch), nil
}

// delay relays in's events in order, each lag after it arrived.
func (s *laggingDurable) delay(ctx context.Context, in <-chan spate.WatchEvent) <-chan spate.WatchEvent {
	type timed struct {
		ev spate.WatchEvent
		at time.Time
	}
	queue := make(chan timed, 1<<16)
	go func() {
		defer close(queue)
		for ev := range in {
			queue <- timed{ev, time.Now()}
		}
	}()
	out := make(chan spate.WatchEvent)
	go func() {
		defer close(out)
		for t := range queue {
			select {
			case <-time.After(time.Until(t.at.Add(s.lag))):
			case <-ctx.Done():
			}
			select {
			case out <- t.ev:
			case <-ctx.Done():
				for range queue {
				}
				return
			}
		}
	}()
	return out
}

// A peer that sees a release's lease delete before its owner-clear (its
// watch of the durable keyspace lags, as on a loaded machine) claims the
// split on the late-release path: its compare-and-swap on the record it
// viewed loses, it reads the record and claims again. That is behaviour,
// not cost: MeasureLifecycle judges the claim without that path's price
// instead of failing once three attempts in a row took it (it did, on
// stores/etcd under load).
func TestLifecycleJudgesALateReleaseByBehaviour(t *testing.T) {
	t.Parallel()
	conformance.MeasureLifecycle(t, func(t testing.TB) conformance.Harness {
		return &lagHarness{root: mem.MustNew(mem.Options{TTL: ttl}), lag: ttl / 3}
	})
}

type lagHarness struct {
	root *mem.Store
	lag  time.Duration
}

func (h *lagHarness) NewStore(context.Context) (spate.Store, error) {
	s, err := h.root.Connect()
	if err != nil {
		return nil, err
	}
	return &laggingDurable{Store: s, lag: h.lag}, nil
}

func (h *lagHarness) Close() error { return h.root.Close() }
