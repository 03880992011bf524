package main

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkRangeScanFixedFleet is the makespan of the 40-split job on a
// fixed fleet of 3 workers (mem store, staging sink): compare it across
// revisions with benchstat to see what a change to the assignment or the
// drains costs the job end to end.
func BenchmarkRangeScanFixedFleet(b *testing.B) {
	for b.Loop() {
		o := options{
			store: "mem://", job: "rangescan", dst: b.TempDir(), ids: 1_000_000, splits: 40, workers: 3, lease: 3 * time.Second,
			log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		_, err := run(ctx, o)
		cancel()
		require.NoError(b, err)
	}
}
