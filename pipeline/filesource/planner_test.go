package filesource_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline/filesource"
)

func TestPlannerIsDeterministicAndPacksByBytes(t *testing.T) {
	dir := t.TempDir()
	corpus(t, dir, map[string]string{"a": strings.Repeat("x\n", 50), "b": strings.Repeat("y\n", 50), "c": strings.Repeat("z\n", 200), "d": "", "e": "q\n"})
	p := filesource.NewPlanner(filesource.Dir(dir), filesource.PlannerOptions{TargetBytes: 250, MaxFiles: 2})
	plan, err := p.Plan(context.Background(), spate.PlanContext{})
	require.NoError(t, err)
	require.Equal(t, spate.PlanFinal, plan.Finality, "a directory backfill plan is final")
	var groups [][]string
	for _, s := range plan.Splits {
		d, err := filesource.DecodeDescriptor(s.Spec.Descriptor)
		require.NoError(t, err)
		var names []string
		for _, f := range d.Files {
			names = append(names, f.Name)
		}
		if d.Range != nil {
			names[0] += fmt.Sprintf("[%d,%d)", d.Range.Start, d.Range.End)
		}
		groups = append(groups, names)
		require.Equal(t, uint64(max(d.Total(), 1)), s.Spec.Weight, "weight %d for %d bytes", s.Spec.Weight, d.Total())
		id := s.Spec.ID.String()
		require.LessOrEqual(t, len(id), spate.SplitIDMaxLen, "id %q", id)
		require.True(t, strings.HasPrefix(id, "f1"), "id %q", id)
	}
	// c, larger than the target, is divided into ranges of equal length.
	want := [][]string{{"a", "b"}, {"c[0,200)"}, {"c[200,400)"}, {"d", "e"}}
	require.Equal(t, fmt.Sprint(want), fmt.Sprint(groups), "packing %v, want %v", groups, want)
	again, _ := p.Plan(context.Background(), spate.PlanContext{})
	for i := range plan.Splits {
		require.Equal(t, plan.Splits[i].Spec.ID, again.Splits[i].Spec.ID, "unchanged files must plan the same ids")
	}
	// An overwritten file is new work.
	later := time.Now().Add(time.Hour)
	require.NoError(t, os.Chtimes(filepath.Join(dir, "c"), later, later))
	changed, _ := p.Plan(context.Background(), spate.PlanContext{})
	require.NotEqual(t, plan.Splits[1].Spec.ID, changed.Splits[1].Spec.ID, "only the changed file's split id may change")
	require.NotEqual(t, plan.Splits[2].Spec.ID, changed.Splits[2].Spec.ID, "only the changed file's split id may change")
	require.Equal(t, plan.Splits[3].Spec.ID, changed.Splits[3].Spec.ID, "only the changed file's split id may change")
	require.Equal(t, plan.Splits[0].Spec.ID, changed.Splits[0].Spec.ID, "only the changed file's split id may change")
}

// A descriptor from the store that no planner could have written is a
// Fatal error, and a directory input refuses names that leave its root.
func TestBadDescriptorsAndEscapingNamesAreRefused(t *testing.T) {
	for _, bad := range []string{
		`{"v":1,"files":[{"name":"a","size":-1,"mtime":0}]}`,
		`{"v":1,"files":[{"name":"","size":3,"mtime":0}]}`,
		`{"v":2,"files":[]}`,
		`{"v":1,"files":[{"name":"a","size":1,"mtime":0,"extra":true}]`,
	} {
		_, err := filesource.DecodeDescriptor([]byte(bad))
		assert.True(t, spate.IsFatal(err), "descriptor %s: %v, want Fatal", bad, err)
	}
	dir := t.TempDir()
	for _, name := range []string{"../outside", "/etc/passwd", "a/../../b"} {
		_, _, err := filesource.Dir(dir).Open(context.Background(), name, 0)
		assert.Error(t, err, "Dir opened %q, which leaves its root", name)
	}
}
