// Package kit is what the conformance suite's fleet and conformance/scale
// share to run coordinators over a harness: a planner of a fixed list of
// splits, a worker's logger and the harness's close.
package kit

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"

	"github.com/spate-go/spate"
)

// StaticPlanner plans a fixed list of splits.
type StaticPlanner struct {
	FP       string
	Splits   []spate.PlannedSplit
	Finality spate.PlanFinality
}

func (p *StaticPlanner) Fingerprint() string { return p.FP }
func (p *StaticPlanner) Plan(context.Context, spate.PlanContext) (spate.SplitPlan, error) {
	return spate.NewSplitPlan(p.Splits, p.Finality), nil
}

// PlanOf plans n weight-1 splits named prefix-00.. as a final plan.
func PlanOf(prefix string, n int) *StaticPlanner {
	p := &StaticPlanner{FP: "conformance:" + prefix, Finality: spate.PlanFinal}
	for i := range n {
		p.Splits = append(p.Splits, spate.NewPlannedSplit(spate.NewSplitSpec(
			spate.MustSplitID(fmt.Sprintf("%s-%02d", prefix, i)), []byte("range:"+prefix))))
	}
	return p
}

// Logger is a worker's logger: discarded unless SPATE_TEST_LOG is set.
func Logger(name string) *slog.Logger {
	if os.Getenv("SPATE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("w", name)
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// CloseHarness closes h and fails tb if that fails: a harness that cannot
// clean up leaves its namespace behind on the server (a denied DeleteJob,
// say), and that is the deployment's problem to see. what names what
// wrote there ("rule", "run") in the error.
func CloseHarness(tb testing.TB, h io.Closer, what string) {
	if err := h.Close(); err != nil {
		tb.Errorf("harness: close: %v (what the %s wrote may be left on the server)", err, what)
	}
}
