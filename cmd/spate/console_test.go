package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
)

// A big job's progress line fits every width: never wider than the width
// less one column, with the bar and as many of the details as fit.
func TestProgressStatusFitsTheWidth(t *testing.T) {
	s := jobSummary{exists: true, splits: 12345, completed: 6789, done: 900 << 30, total: 1800 << 30}
	here := "this worker: " + count(123456789) + " lines, " + count(98765) + " lines/s"
	for _, width := range []int{10, 20, 40, 60, 80, 100, 120, 200} {
		got := progressStatus(width, 0.5, s, here, bytesStr)
		assert.LessOrEqual(t, utf8.RuneCountInString(got), width-1, "width %d: %q", width, got)
		switch {
		case width >= 160:
			assert.Contains(t, got, "this worker", "width %d", width)
			assert.Contains(t, got, "6789/12345 splits", "width %d", width)
		case width >= 60:
			assert.Contains(t, got, "6789/12345 splits", "width %d", width)
			assert.Contains(t, got, "[#", "width %d", width)
		case width >= 20:
			assert.Contains(t, got, "50%", "width %d", width)
		}
	}
}

// A table job's progress line counts rows, not bytes.
func TestProgressStatusOfATableCountsRows(t *testing.T) {
	s := jobSummary{exists: true, splits: 40, completed: 10, done: 500_000, total: 2_000_000}
	in := &input{table: &tableInput{}}
	got := progressStatus(120, 0.25, s, "this worker: 500,000 rows, 100,000 rows/s", in.amount)
	assert.Contains(t, got, "10/40 splits  500,000/2,000,000 rows  this worker")
	assert.NotContains(t, got, "iB")
}

// The progress total is the planned rows of a table: an empty chunk (the
// open-ended last chunk of a table whose rows fill the others exactly)
// adds none, so 1,000,000 rows are not shown as 1,000,001.
func TestProgressTotalOfATableIsItsRows(t *testing.T) {
	js := &spate.JobState{Plan: spate.PlanState{Finality: spate.PlanFinal, Planned: 3}}
	for i, w := range []uint64{500_000, 500_000, 0} {
		js.Splits = append(js.Splits, spate.SplitState{ID: spate.MustSplitID(fmt.Sprintf("chunk-%06d", i)),
			Status: spate.StatusCompleted, Weight: w, HasSpec: true})
	}
	s := summarize(js)
	assert.EqualValues(t, 1_000_000, s.total)
	assert.EqualValues(t, 1_000_000, s.done)
	in := &input{table: &tableInput{}}
	assert.Contains(t, progressStatus(120, 1, s, "", in.amount), "1,000,000/1,000,000 rows")
}

// The store records an empty chunk's weight 0 as 1 (the coordinator's
// planner seeds a spec's weight as at least 1): a table's completed
// chunks count the rows they copied, so a 2,000,000-row table whose rows
// fill its chunks exactly is not shown as 2,000,001 rows once done.
func TestProgressTotalOfACopiedTableIsItsRows(t *testing.T) {
	js := &spate.JobState{Plan: spate.PlanState{Finality: spate.PlanFinal, Planned: 3,
		Fingerprint: `pgsource:v1:{"T":"public.events","K":"id"}`}}
	for i, w := range []int64{1_000_000, 1_000_000, 0} {
		js.Splits = append(js.Splits, spate.SplitState{ID: spate.MustSplitID(fmt.Sprintf("chunk-%06d", i)),
			Status: spate.StatusCompleted, Weight: uint64(max(w, 1)), HasSpec: true,
			Progress: &spate.SplitProgress{Watermark: w, Completed: true}})
	}
	s := summarize(js)
	assert.EqualValues(t, 2_000_000, s.total)
	assert.EqualValues(t, 2_000_000, s.done)
	in := &input{table: &tableInput{}}
	assert.Contains(t, progressStatus(120, 1, s, "", in.amount), "2,000,000/2,000,000 rows")
}

// A gained chunk of a table is shown by its key range and planned rows,
// and where it resumes in rows, not bytes.
func TestGainedChunkOfATableShowsKeysAndRows(t *testing.T) {
	width := 300
	con, out := testConsole(&width)
	o := newObserver(con, nil)
	o.table = true
	spec := spate.NewSplitSpec(spate.MustSplitID("chunk-000001"), []byte(`{"lo":"100","hi":"2100"}`)).WithWeight(2000)
	p := spate.NewSplitProgress(500, []byte("k600"))
	o.event(spate.Gained{Split: spec, Epoch: 2, Progress: &p})
	assert.Contains(t, out.String(), "gained chunk-000001 (epoch 2) [keys (100, 2100], about 2,000 rows], resuming at row 500 of about 2,000")
	assert.NotContains(t, out.String(), "byte")
	last := spate.NewSplitSpec(spate.MustSplitID("chunk-000002"), []byte(`{"lo":"2100"}`)).WithWeight(1500)
	o.event(spate.Gained{Split: last, Epoch: 1})
	assert.Contains(t, out.String(), "gained chunk-000002 (epoch 1) [keys (2100, end], about 1,500 rows], from the start")
}

// A completed chunk of a table is named by its key range too, not as a
// split of "no files".
func TestCompletedChunkOfATableShowsKeys(t *testing.T) {
	width := 300
	con, out := testConsole(&width)
	o := newObserver(con, nil)
	o.table = true
	spec := spate.NewSplitSpec(spate.MustSplitID("chunk-000001"), []byte(`{"lo":"100","hi":"2100"}`)).WithWeight(2000)
	o.event(spate.Gained{Split: spec, Epoch: 1})
	o.commit(spec.ID, 1, spate.CompletedProgress(2000, []byte("k2100")), nil)
	assert.Contains(t, out.String(), "completed chunk-000001 [keys (100, 2100], about 2,000 rows]")
	assert.NotContains(t, out.String(), "files")
}

func TestFitWidth(t *testing.T) {
	assert.Equal(t, "short", fitWidth("short", 80))
	assert.Equal(t, "abcd…", fitWidth("abcdefghij", 6))
	assert.Equal(t, 79, utf8.RuneCountInString(fitWidth(strings.Repeat("é", 200), 80)))
}

// testConsole is a terminal console over a buffer, width columns wide.
func testConsole(width *int) (*console, *bytes.Buffer) {
	var out bytes.Buffer
	return &console{out: &out, errOut: &out, tty: true, start: time.Now(), width: func() int { return *width }}, &out
}

// The status line is cut to the terminal's width, so it never wraps; after
// the window is narrowed under it, the next redraw erases every row it now
// takes, not only the last one.
func TestConsoleStatusFitsAndClearsStaleRows(t *testing.T) {
	width := 80
	c, out := testConsole(&width)
	c.setStatus(strings.Repeat("x", 150))
	drawn := out.String()
	require.True(t, strings.HasSuffix(drawn, strings.Repeat("x", 78)+"…"), "%q", drawn)
	assert.NotContains(t, drawn, strings.Repeat("x", 80))

	// Narrowed to 30 columns: the 79 columns drawn now take 3 rows.
	width = 30
	out.Reset()
	c.line("an event")
	got := out.String()
	require.True(t, strings.HasPrefix(got, clearLine+cursorUpClear+cursorUpClear), "%q", got)
	assert.NotContains(t, got, clearLine+cursorUpClear+cursorUpClear+cursorUpClear)
	assert.Contains(t, got, "an event\n")
	assert.True(t, strings.HasSuffix(got, strings.Repeat("x", 28)+"…"), "%q", got)

	// At an unchanged width, one row is erased.
	out.Reset()
	c.setStatus("short")
	assert.Equal(t, clearLine+"short", out.String())
	out.Reset()
	c.endStatus()
	assert.Equal(t, clearLine, out.String())
}

// An unknown width is taken as 80 columns; $COLUMNS is read when the
// window size cannot be asked for.
func TestConsoleWidthFallbacks(t *testing.T) {
	width := 0
	c, _ := testConsole(&width)
	assert.Equal(t, defaultWidth, c.columns())
	t.Setenv("COLUMNS", "132")
	assert.Equal(t, 132, columnsEnv())
	t.Setenv("COLUMNS", "wide")
	assert.Equal(t, 0, columnsEnv())
}
