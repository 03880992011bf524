package filesource_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline/filesource"
)

// BenchmarkFollowPlan is the planner's part of one replan of a followed
// directory of n files: the listing, an identity (statx) per file, and
// the splits and cursor built. The coordinator's part (seeding what is
// new) is spate's BenchmarkReplanOfAnOpenPlan.
func BenchmarkFollowPlan(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("files=%d", n), func(b *testing.B) {
			dir := b.TempDir()
			for i := range n {
				sub := filepath.Join(dir, fmt.Sprintf("d%03d", i%100))
				if i < 100 {
					if err := os.Mkdir(sub, 0o755); err != nil {
						b.Fatal(err)
					}
				}
				if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%06d.log", i)), []byte("a line\n"), 0o644); err != nil {
					b.Fatal(err)
				}
			}
			p := filesource.NewPlanner(filesource.Dir(dir), filesource.PlannerOptions{Follow: true})
			plan, err := p.Plan(context.Background(), spate.PlanContext{})
			if err != nil || len(plan.Splits) != n {
				b.Fatalf("plan: %d splits, %v", len(plan.Splits), err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := p.Plan(context.Background(), spate.PlanContext{PlannerState: plan.PlannerState}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
