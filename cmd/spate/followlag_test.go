package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline/filesource"
)

// /metrics carries one lag series per followed file, by its path now,
// bounded: beyond maxLagSeries the files least behind are summed.
func TestFollowLagMetricsAreBounded(t *testing.T) {
	l := newFollowLag("")
	var files []filesource.FileLag
	for i := range maxLagSeries + 20 {
		f := filesource.FileLag{Split: fmt.Sprint(i), Bytes: int64(i), Age: time.Duration(i) * time.Second, Waiting: i%10 == 0}
		f.Name = fmt.Sprintf("app%03d.log", i)
		files = append(files, f)
	}
	l.files, l.ok = files, true
	reg := prometheus.NewRegistry()
	reg.MustRegister(l)
	n, err := testutil.GatherAndCount(reg, "spate_follow_lag_bytes", "spate_follow_lag_seconds")
	require.NoError(t, err)
	assert.Equal(t, 2*maxLagSeries, n)
	// The furthest behind are shown by name; the rest are summed.
	var other int64
	for i := range 21 {
		other += int64(i)
	}
	want := fmt.Sprintf(`
# HELP spate_follow_files Followed files whose split is not complete, by state: following (a lane holds it) or waiting (for a lane).
# TYPE spate_follow_files gauge
spate_follow_files{state="following"} %d
spate_follow_files{state="waiting"} %d
`, maxLagSeries+20-7, 7)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), "spate_follow_files"))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "spate_follow_lag_bytes" {
			continue
		}
		for _, m := range mf.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	assert.Equal(t, float64(other), got[otherFiles])
	assert.Equal(t, float64(maxLagSeries+19), got["app069.log"])
	assert.NotContains(t, got, "app000.log")

	// A file whose split completed is no longer measured: its series goes.
	l.files = files[:3]
	n, err = testutil.GatherAndCount(reg, "spate_follow_lag_bytes")
	require.NoError(t, err)
	assert.Equal(t, 3, n)
}

// The progress line counts the files that wait for a lane, and their
// bytes, not only what the commits recorded.
func TestFollowingLineCountsWaitingFiles(t *testing.T) {
	files := []filesource.FileLag{{Bytes: 100, Age: 3 * time.Second}, {Bytes: 1300, Waiting: true, Age: 12 * time.Second}}
	line := followingLine(jobSummary{splits: 5, completed: 3}, totalLag(files), "here")
	assert.Equal(t, "following 2 files, 1 waiting for a lane (5 splits, 3 completed): 1.4 KiB behind (oldest unread byte ~12s old); here", line)

	// Ages are rounded as the job page rounds them.
	for age, want := range map[time.Duration]string{
		400 * time.Millisecond:                               "(oldest unread byte <1s old)",
		3*time.Minute + 5*time.Second + 400*time.Millisecond: "(oldest unread byte ~3m05s old)",
	} {
		line = followingLine(jobSummary{splits: 1}, totalLag([]filesource.FileLag{{Bytes: 10, Age: age}}), "here")
		assert.Contains(t, line, want)
	}
}

// A planned rebalance whose drain was cut short is said to be one, not a
// loss; a lease that ended otherwise is a loss.
func TestARevokedSplitIsNotCalledLost(t *testing.T) {
	width := 200
	con, out := testConsole(&width)
	o := newObserver(con, nil)
	a, b := spate.MustSplitID("a"), spate.MustSplitID("b")
	o.event(spate.RevokeRequested{Split: a})
	o.event(spate.Lost{Split: a})
	assert.Contains(t, out.String(), "rebalance: a handed to a peer")
	assert.NotContains(t, out.String(), "lost a")
	assert.Zero(t, o.lost)
	o.event(spate.Lost{Split: b})
	assert.Contains(t, out.String(), "lost b: its lease ended here")
	assert.Equal(t, 1, o.lost)
}

// The console names a followed file where it is now, as the split's last
// commit recorded it, and the name it was found under after a rename: on
// a gain, and on the completion, with why the split completed.
func TestConsoleNamesAFollowedFileByItsCurrentPath(t *testing.T) {
	width := 300
	con, out := testConsole(&width)
	o := newObserver(con, nil)
	spec, err := filesource.TailSplitFor(filesource.Member{Name: "app.log", Size: 10}, filesource.FileID{Dev: 1, Ino: 2})
	require.NoError(t, err)
	renamed := spate.NewSplitProgress(40, []byte(`{"size":40,"name":"app.log.1"}`))
	o.event(spate.Gained{Split: spec, Epoch: 3, Progress: &renamed})
	assert.Contains(t, out.String(), "[follows app.log.1 (found as app.log)], resuming at byte 40")

	fresh, err := filesource.TailSplitFor(filesource.Member{Name: "web.log", Size: 10}, filesource.FileID{Dev: 1, Ino: 3})
	require.NoError(t, err)
	o.event(spate.Gained{Split: fresh, Epoch: 1})
	assert.Contains(t, out.String(), "[follows web.log], from the start")
	done := spate.CompletedProgress(90, []byte(`{"size":90,"name":"web.log.1","end":"deleted"}`))
	o.commit(fresh.ID, 1, done, nil)
	assert.Contains(t, out.String(), "completed "+fresh.ID.String()+" [follows web.log.1 (found as web.log)]: "+filesource.EndReason("deleted"))
}
