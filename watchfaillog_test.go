package spate_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/mem"
)

// logLines records a logger's lines: level and message.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, r.Level.String()+" "+r.Message)
	return nil
}
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logLines) WithGroup(string) slog.Handler      { return l }

// count is how many lines are exactly line.
func (l *logLines) count(line string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.lines {
		if s == line {
			n++
		}
	}
	return n
}

// downWatches is a store whose watches can be taken down: goDown breaks
// every open watch (a Retryable WatchError, as a lost connection does)
// and fails every new one until goUp.
type downWatches struct {
	*watchLog
	mu    sync.Mutex
	down  bool
	brk   chan struct{} // closed by goDown
	tries atomic.Int64  // watches refused while down
}

var errGone = spate.Retryablef("dial tcp 127.0.0.1:2379: connect: connection refused")

func (d *downWatches) goDown() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.down = true
	close(d.brk)
}

func (d *downWatches) goUp() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.down, d.brk = false, make(chan struct{})
}

func (d *downWatches) Watch(ctx context.Context, ks spate.Keyspace, prefix string) (<-chan spate.WatchEvent, error) {
	return d.open(ctx, func() (<-chan spate.WatchEvent, error) { return d.watchLog.Watch(ctx, ks, prefix) })
}

func (d *downWatches) WatchKeys(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
	return d.open(ctx, func() (<-chan spate.WatchEvent, error) { return d.watchLog.WatchKeys(ctx, ks, keys) })
}

func (d *downWatches) open(ctx context.Context, watch func() (<-chan spate.WatchEvent, error)) (<-chan spate.WatchEvent, error) {
	d.mu.Lock()
	down, brk := d.down, d.brk
	d.mu.Unlock()
	if down {
		d.tries.Add(1)
		return nil, errGone
	}
	in, err := watch()
	if err != nil {
		return nil, err
	}
	out := make(chan spate.WatchEvent)
	go func() {
		defer close(out)
		defer func() {
			<-ctx.Done()
			for range in {
			}
		}()
		for {
			select {
			case ev, ok := <-in:
				if !ok {
					return
				}
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			case <-brk:
				select {
				case out <- spate.WatchEvent{Kind: spate.WatchError, Err: errGone}:
				case <-ctx.Done():
				}
				return
			}
		}
	}()
	return out, nil
}

// A worker whose watches keep failing while its store is away (the
// default store's host died) logged "key watch failed; retrying" at WARN
// on every try, for as long as it lasted, after the ERROR line that
// already said what happened. It says it once, then at most every 30 s
// (doubling), and once at INFO when a watch is established again.
func TestFailingKeyWatchIsSaidOnceThenRateLimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := mem.MustNew(mem.Options{TTL: testLease})
		defer s.Close()
		var splits []spate.PlannedSplit
		for i := range 4 {
			splits = append(splits, spate.NewPlannedSplit(spate.NewSplitSpec(spate.MustSplitID(fmt.Sprintf("fl-%02d", i)), nil)))
		}
		p := fixedPlanner{fp: "test:faillog", plan: spate.NewSplitPlan(splits, spate.PlanFinal)}
		ca, err := s.Connect()
		require.NoError(t, err)
		a := startTWWith(t, newWatchLog(ca), testCfg("a"), p, slog.New(slog.DiscardHandler))
		pumpUntil(t, 40*testLease, "a leads and holds the job", func() bool { return len(a.held) == 4 }, a)

		// b joins, not leading: it watches its own keys. Then its store
		// goes away: every watch breaks, and every try to watch again
		// fails for a minute.
		cb, err := s.Connect()
		require.NoError(t, err)
		b := &downWatches{watchLog: newWatchLog(cb), brk: make(chan struct{})}
		logs := &logLines{}
		wb := startTWWith(t, b, testCfg("b"), p, slog.New(logs))
		pumpUntil(t, 40*testLease, "b holds splits", func() bool { return len(wb.held) > 0 }, a, wb)
		b.goDown()
		const window = 40 * testLease // 60 s
		for end := time.Now().Add(window); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			a.pump()
			wb.pump()
		}
		tries := b.tries.Load()
		warned := logs.count("WARN key watch failed; retrying") + logs.count("WARN re-watch failed; retrying")
		require.Greater(t, tries, int64(20), "the watches were not retried")
		t.Logf("%d failed watch tries in %v, %d said at WARN", tries, window, warned)
		require.LessOrEqual(t, warned, 3, "a failing watch is said once, then at most every 30 s (doubling): %d WARN lines for %d tries:\n%s",
			warned, tries, strings.Join(logs.lines, "\n"))
		require.GreaterOrEqual(t, warned, 1, "the failure was never said")

		b.goUp()
		pumpUntil(t, 20*testLease, "b's watches established again", func() bool { return logs.count("INFO watch established again") == 1 }, a, wb)
	})
}
