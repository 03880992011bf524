package spate

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ----- spawn, splitIO, onSplit --------------------------------------------------------

// A split's writes are ordered: work queued behind a write in flight runs
// when it finishes, in order; and work that starts a write of its own holds
// back the rest until that one has finished too. Other splits are not held
// up.
func TestSplitIORunsQueuedWorkInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestActor(t, nil, testConfig())
		var trace []string
		gate := map[string]chan struct{}{"w1": make(chan struct{}), "w2": make(chan struct{}), "other": make(chan struct{})}
		write := func(id, name string) {
			a.splitIO(id, func(ctx context.Context) func() error {
				<-gate[name]
				return func() error { trace = append(trace, name+" done"); return nil }
			})
		}
		step := func(name string, f func()) func() error {
			return func() error {
				trace = append(trace, name)
				if f != nil {
					f()
				}
				return nil
			}
		}
		write("s", "w1")
		require.True(t, a.io.busy["s"])
		require.NoError(t, a.onSplit("s", step("q1", nil)))
		require.NoError(t, a.onSplit("s", step("q2", func() { write("s", "w2") })))
		require.NoError(t, a.onSplit("s", step("q3", nil)))
		require.NoError(t, a.onSplit("t", step("t-now", nil)))
		write("u", "other")
		assert.Equal(t, []string{"t-now"}, trace, "queued work waits; another split runs at once")

		close(gate["other"])
		synctest.Wait()
		require.NoError(t, a.io.runResults())
		assert.Equal(t, []string{"t-now", "other done"}, trace, "another split's write finishes without waiting for s")

		close(gate["w1"])
		synctest.Wait()
		require.NoError(t, a.io.runResults())
		assert.Equal(t, []string{"t-now", "other done", "w1 done", "q1", "q2"}, trace,
			"after w1: q1, then q2, which starts w2; q3 waits for w2")
		assert.True(t, a.io.busy["s"])
		assert.Len(t, a.io.later["s"], 1)

		close(gate["w2"])
		synctest.Wait()
		require.NoError(t, a.io.runResults())
		assert.Equal(t, []string{"t-now", "other done", "w1 done", "q1", "q2", "w2 done", "q3"}, trace)
		assert.Empty(t, a.io.busy)
		assert.Empty(t, a.io.later)
	})
}

// A continuation's error stops the results run and is the loop's error; a
// queued step's error is returned too.
func TestSplitIOErrorsReachTheLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestActor(t, nil, testConfig())
		boom := errors.New("boom")
		ran := false
		a.splitIO("s", func(context.Context) func() error { return func() error { return boom } })
		require.NoError(t, a.onSplit("s", func() error { ran = true; return nil }))
		synctest.Wait()
		assert.ErrorIs(t, a.io.runResults(), boom)
		assert.False(t, ran, "work queued behind a failed continuation does not run")
		assert.False(t, a.io.busy["s"])

		a.splitIO("t", func(context.Context) func() error { return nil })
		require.NoError(t, a.onSplit("t", func() error { return boom }))
		synctest.Wait()
		assert.ErrorIs(t, a.io.runResults(), boom)
	})
}

// A nil continuation is skipped; I/O runs with the actor's context.
func TestSpawnRunsIOBesideTheLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestActor(t, nil, testConfig())
		var sawCtx context.Context
		a.spawn(func(ctx context.Context) func() error { sawCtx = ctx; return nil })
		synctest.Wait()
		require.NoError(t, a.io.runResults())
		assert.Equal(t, a.ctx, sawCtx)
	})
}

// Stopping the I/O waits for the I/O in flight and folds its results; nothing new
// starts after it.
func TestStopIOFoldsWhatIsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newTestActor(t, nil, testConfig())
		folded := false
		a.splitIO("s", func(context.Context) func() error {
			time.Sleep(time.Second)
			return func() error { folded = true; return nil }
		})
		a.io.stop()
		assert.True(t, folded, "a result that arrives as the loop stops is folded")
		started := false
		a.spawn(func(context.Context) func() error { started = true; return nil })
		a.splitIO("t", func(context.Context) func() error { started = true; return nil })
		synctest.Wait()
		assert.False(t, started)
		assert.False(t, a.io.busy["t"], "a refused write does not leave its split busy")
	})
}

// ----- retry backoff ----------------------------------------------------------------

func TestRetryBackoff(t *testing.T) {
	cfg := testConfig()
	a := newTestActor(t, nil, cfg)
	assert.Equal(t, max(cfg.LeaseDuration/20, 50*time.Millisecond), a.c.tm.retry)
	cfg.LeaseDuration = 300 * time.Millisecond
	assert.Equal(t, 50*time.Millisecond, newTestActor(t, nil, cfg).c.tm.retry, "the floor holds for short leases")

	now := time.Now()
	x, y := opKey{"claim", "x"}, opKey{"claim", "y"}
	assert.True(t, a.io.due(x, now), "an operation that never failed is due")
	a.failed(x)
	at := a.io.retry[x]
	assert.False(t, a.io.due(x, at.Add(-time.Nanosecond)), "a failed operation waits out the retry delay")
	assert.True(t, a.io.due(x, at), "and is due once it has")
	assert.NotContains(t, a.io.retry, x, "being due clears the hold")
	assert.True(t, a.io.due(y, now), "another split's operation is not held back")
}

func TestTickInterval(t *testing.T) {
	for _, c := range []struct {
		lease, drain time.Duration
		want         time.Duration
	}{
		{30 * time.Second, 10 * time.Second, 2500 * time.Millisecond},
		{3 * time.Second, 10 * time.Second, 500 * time.Millisecond},
		{300 * time.Millisecond, 20 * time.Millisecond, 10 * time.Millisecond},
	} {
		cfg := testConfig()
		cfg.LeaseDuration, cfg.DrainDeadline = c.lease, c.drain
		a := newTestActor(t, nil, cfg)
		assert.Equal(t, c.want, a.c.tm.tick, fmt.Sprintf("lease %v drain %v", c.lease, c.drain))
	}
}

// ----- step -----------------------------------------------------------------------

// step ends rebalance-delay windows that are over and marks the assignment
// dirty; a latched terminal verdict stops every decision, an election
// included; without one, a worker that sees no leader stands.
func TestStepExpiresDelayWindowsAndStopsWhenTerminal(t *testing.T) {
	st := newFakeStore()
	a := newTestActor(t, st, testConfig())
	p := &planRecord{Schema: SchemaVersion, Fingerprint: testFP, Finality: finalityOpen}
	a.planning.plan, a.planning.planRev = p, st.put(Durable, keyPlan, encode(p))
	a.verdicts.terminal = true
	a.members.departed["gone"] = time.Now().Add(-a.cfg.RebalanceDelay)
	a.members.departed["recent"] = time.Now()
	require.NoError(t, a.step())
	assert.NotContains(t, a.members.departed, "gone")
	assert.Contains(t, a.members.departed, "recent")
	assert.True(t, a.dirty)
	assert.False(t, a.leader.electing, "no election after a terminal verdict")
	assert.Equal(t, 1.0, testutil.ToFloat64(a.m.idle))
	assert.Equal(t, 1.0, testutil.ToFloat64(a.m.liveWorkers), "self counts as live")

	a.verdicts.terminal = false
	require.NoError(t, a.step())
	assert.True(t, a.leader.electing, "no leader seen: stand for election")
	settleIO(t, a)
	assert.NotNil(t, a.leader.term)
	assert.Equal(t, 1, st.count("create", keyLeader))
}

func TestTheWakeTimerFiresAtTheEarliestTimeArmed(t *testing.T) {
	var w wakeTimer
	w.arm(time.Now()) // before the loop starts: nothing to arm
	assert.True(t, w.at.IsZero())

	w.start()
	defer w.stop()
	now := time.Now()
	later, soon := now.Add(time.Hour), now.Add(20*time.Millisecond)
	w.arm(later)
	assert.Equal(t, later, w.at)
	w.arm(soon)
	assert.Equal(t, soon, w.at, "an earlier time replaces a later one")
	w.arm(later)
	assert.Equal(t, soon, w.at, "a later time does not postpone it")

	select {
	case <-w.c():
	case <-time.After(10 * time.Second):
		t.Fatal("the timer never fired")
	}
	w.fired()
	assert.True(t, w.at.IsZero())
	w.arm(later)
	assert.Equal(t, later, w.at, "once fired, any time arms it anew")
}

func TestAFailedOperationIsHeldBackUntilItsRetryTime(t *testing.T) {
	l := loopIO{retry: map[opKey]time.Time{}}
	k := opKey{op: "claim", split: "s"}
	now := time.Now()
	assert.True(t, l.due(k, now), "an operation that never failed is due")

	l.retry[k] = now.Add(time.Second)
	assert.False(t, l.due(k, now))
	assert.False(t, l.due(k, now.Add(999*time.Millisecond)))
	assert.True(t, l.due(opKey{op: "claim", split: "t"}, now), "keys are held back one by one")
	assert.True(t, l.due(k, now.Add(time.Second)))
	assert.NotContains(t, l.retry, k, "a due operation's hold is spent")
}
