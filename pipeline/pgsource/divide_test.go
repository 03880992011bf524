package pgsource_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/pgsource"
)

// A chunk divided while its lane reads (rows read ahead and not yet
// emitted included) becomes a primary the lane finishes and a residual a
// new lane reads: every row exactly once, the primary's keys all below the
// residual's. A refused division leaves the lane reading its whole chunk.
func TestDivideAChunkWhileItIsRead(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, `CREATE TABLE big (id int PRIMARY KEY, pad text);
		INSERT INTO big SELECT i, repeat('p', 20) FROM generate_series(1, 20000) i;`)
	src, err := pgsource.New(context.Background(), pgsource.Options{URL: url, Table: "big", ChunkRows: 100000})
	require.NoError(t, err)
	specs := plan(t, src)
	require.Len(t, specs, 1)
	spec := specs[0]
	ids := func(rows []pipeline.RawPayload) []string {
		var out []string
		for _, r := range rows {
			out = append(out, *pgsource.Fields(r.Value)[0])
		}
		return out
	}
	check := func(t *testing.T, got []string) {
		t.Helper()
		seen := map[string]int{}
		for _, id := range got {
			seen[id]++
		}
		var dups, missing int
		for i := 1; i <= 20000; i++ {
			switch n := seen[itoa(i)]; {
			case n == 0:
				missing++
			case n > 1:
				dups += n - 1
			}
		}
		require.Zero(t, dups, "rows read twice")
		require.Zero(t, missing, "rows lost")
		require.Len(t, seen, 20000)
	}

	t.Run("kept", func(t *testing.T) {
		l := open(t, src, spec, nil, nil)
		head, _ := drain(t, src, spec.ID, l, 500, 3000)
		pos, ok := src.DivisionPoint(spec.ID)
		require.True(t, ok, "17,000 rows left are worth a division")
		require.GreaterOrEqual(t, pos, int64(len(head)))
		d, ok := src.TrySplit(spec.ID, pos)
		require.True(t, ok)
		require.Equal(t, pos+1, d.Position, "the position is just past the cut key's ordinal")
		src.SplitDone(spec.ID, d, true)
		tail, last := drain(t, src, spec.ID, l, 500, 0)
		src.CloseSplit(spec.ID)
		require.True(t, last.Completed)
		primary := append(head, tail...)
		require.EqualValues(t, d.Position, len(primary), "the primary holds the rows up to the cut")
		child := spate.NewSplitSpec(spate.ChildSplitID(spec.ID, d.Position), d.Residual).WithWeight(d.ResidualWeight)
		l2 := open(t, src, child, nil, nil)
		residual, _ := drain(t, src, child.ID, l2, 500, 0)
		src.CloseSplit(child.ID)
		p, r := ids(primary), ids(residual)
		require.NotEmpty(t, r)
		require.Equal(t, itoa(int(d.Position)), p[len(p)-1], "the primary ends at the cut key")
		require.Equal(t, itoa(int(d.Position)+1), r[0], "the residual starts after it")
		check(t, append(p, r...))
	})
	t.Run("refused", func(t *testing.T) {
		l := open(t, src, spec, nil, nil)
		head, _ := drain(t, src, spec.ID, l, 500, 3000)
		d, ok := src.TrySplit(spec.ID, 9000)
		require.True(t, ok)
		src.SplitDone(spec.ID, d, false)
		tail, last := drain(t, src, spec.ID, l, 500, 0)
		src.CloseSplit(spec.ID)
		require.True(t, last.Completed)
		check(t, ids(append(head, tail...)))
	})
}

func itoa(i int) string { return fmt.Sprint(i) }
