package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline/filesource"
)

// spate inspect tells a split a live worker holds (leased) from one waiting
// for a worker (runnable), and shows what each split has left to commit
// (its lag) where its size is known.
func TestInspectionDistinguishesLeasedAndShowsLag(t *testing.T) {
	split := func(id string, st spate.SplitStatus, lease string, weight uint64, wm int64, hasProgress bool) spate.SplitState {
		s := spate.SplitState{ID: spate.MustSplitID(id), Status: st, LeaseOwner: lease, Owner: lease, Weight: weight, HasSpec: weight > 0}
		if hasProgress {
			s.Progress = &spate.SplitProgress{Watermark: wm, Completed: st == spate.StatusCompleted}
		}
		return s
	}
	js := &spate.JobState{
		Plan: spate.PlanState{Fingerprint: "fp", Finality: spate.PlanFinal, Planned: 5},
		Splits: []spate.SplitState{
			split("a-done", spate.StatusCompleted, "", 1000, 1000, true),
			split("b-leased", spate.StatusRunnable, "worker-1", 1000, 400, true),
			split("c-waiting", spate.StatusRunnable, "", 1000, 0, false),
			split("d-poison", spate.StatusQuarantined, "", 1000, 100, true),
			split("e-nospec", spate.StatusRunnable, "", 0, 0, false),
		},
	}
	in := inspectionOf("job", "store", js, nil)
	assert.Equal(t, 1, in.Summary.Leased)
	assert.Equal(t, 2, in.Summary.Runnable)
	assert.Equal(t, 1, in.Summary.Completed)
	assert.Equal(t, 1, in.Summary.Quarantined)
	assert.Equal(t, "running", in.Summary.State)
	assert.Equal(t, int64(600+1000+900), in.Summary.BytesRemaining)

	want := map[string]struct {
		state     string
		remaining *int64
	}{
		"a-done":    {"completed", ptr(int64(0))},
		"b-leased":  {"leased", ptr(int64(600))},
		"c-waiting": {"runnable", ptr(int64(1000))},
		"d-poison":  {"quarantined", ptr(int64(900))},
		"e-nospec":  {"runnable", nil},
	}
	require.Len(t, in.Splits, len(want))
	for _, sp := range in.Splits {
		w := want[sp.ID]
		assert.Equal(t, w.state, sp.State, sp.ID)
		assert.Equal(t, w.remaining, sp.Remaining, sp.ID)
	}
	assert.Equal(t, string(spate.StatusRunnable), in.Splits[1].Status, "the stored status stays in the JSON")

	var out bytes.Buffer
	printInspection(&out, in)
	text := out.String()
	assert.Regexp(t, regexp.MustCompile(`(?m)^b-leased\s+leased\s+worker-1\s.*\s600 B\s+worker-1$`), text)
	assert.Regexp(t, regexp.MustCompile(`(?m)^c-waiting\s+runnable\s+-\s.*\s1000 B\s+-$`), text)
	assert.Regexp(t, regexp.MustCompile(`(?m)^e-nospec\s+runnable\s.*\s\?\s+-$`), text)
	assert.Contains(t, text, "1 leased (running), 2 runnable (waiting), 1 quarantined")
	assert.Contains(t, text, "2.4 KiB remaining")
}

// A job whose only unfinished splits are held is running, not stalled.
func TestSummaryLeasedIsNotStalled(t *testing.T) {
	js := &spate.JobState{
		Plan: spate.PlanState{Finality: spate.PlanFinal, Planned: 2},
		Splits: []spate.SplitState{
			{ID: spate.MustSplitID("a"), Status: spate.StatusQuarantined, Weight: 10, HasSpec: true},
			{ID: spate.MustSplitID("b"), Status: spate.StatusRunnable, LeaseOwner: "w", Weight: 10, HasSpec: true},
		},
	}
	s := summarize(js)
	assert.False(t, s.stalled)
	assert.Equal(t, 1, s.leased)
	assert.Equal(t, 0, s.runnable)
}

func ptr[T any](v T) *T { return &v }

// A split whose record cannot be read is shown as damaged, with the cause
// and the fix, and a job whose other splits are done is stalled on it.
func TestInspectionShowsDamagedSplitsWithTheirFix(t *testing.T) {
	cause := fmt.Errorf("durable record %q is unreadable: %w", "split.b", spate.ErrUnreadableRecord)
	js := &spate.JobState{
		Plan: spate.PlanState{Finality: spate.PlanFinal, Planned: 2},
		Splits: []spate.SplitState{
			{ID: spate.MustSplitID("a"), Status: spate.StatusCompleted, Weight: 10, HasSpec: true, Progress: &spate.SplitProgress{Watermark: 10, Completed: true}},
			{ID: spate.MustSplitID("b"), Status: spate.StatusDamaged, Weight: 10, HasSpec: true, Damage: cause, DamageFix: "delete the key"},
		},
	}
	in := inspectionOf("job", "store", js, nil)
	assert.Equal(t, 1, in.Summary.Damaged)
	assert.Equal(t, 0, in.Summary.Runnable)
	assert.Equal(t, "stalled", in.Summary.State)
	assert.Equal(t, "damaged", in.Splits[1].State)
	assert.Contains(t, in.Splits[1].Damage, "split.b")
	assert.Equal(t, "delete the key", in.Splits[1].DamageFix)

	var out bytes.Buffer
	printInspection(&out, in)
	assert.Contains(t, out.String(), "0 quarantined, 1 damaged")
	assert.Regexp(t, regexp.MustCompile(`(?m)^b\s+damaged\s`), out.String())
	assert.Contains(t, out.String(), "fix: delete the key")
}

// A continuous job's inspection shows each followed file's lag as its
// last commit recorded it (the file's size then, less the watermark), how
// long ago that commit was when bytes were left, and the job's total.
func TestInspectionShowsAFollowedJobsLag(t *testing.T) {
	tail := func(id string, wm int64, state string, at time.Time) spate.SplitState {
		return spate.SplitState{ID: spate.MustSplitID(id), Status: spate.StatusRunnable, LeaseOwner: "w1", Owner: "w1",
			Weight: 10, HasSpec: true, WrittenAt: at,
			Progress: &spate.SplitProgress{Watermark: wm, State: []byte(state)}}
	}
	js := &spate.JobState{
		Plan: spate.PlanState{Fingerprint: "fp", Finality: spate.PlanOpen, Planned: 2},
		Splits: []spate.SplitState{
			tail("t-behind", 400, `{"size":1000}`, time.Now().Add(-30*time.Second)),
			tail("t-level", 300, `{"base":100,"size":200}`, time.Now()), // truncated once: 200 of 200 read
		},
	}
	in := inspectionOf("job", "store", js, nil)
	assert.Equal(t, "following", in.Summary.State)
	assert.Equal(t, 2, in.Summary.Followed)
	assert.Equal(t, int64(600), in.Summary.Lag)
	require.Len(t, in.Splits, 2)
	assert.Equal(t, ptr(int64(600)), in.Splits[0].Remaining)
	assert.Equal(t, "30s", in.Splits[0].Behind)
	assert.Equal(t, ptr(int64(0)), in.Splits[1].Remaining)
	assert.Empty(t, in.Splits[1].Behind)

	var out bytes.Buffer
	printInspection(&out, in)
	assert.Equal(t, "30s", in.Summary.Behind, "the oldest commit that left bytes unread")
	assert.Contains(t, out.String(), "follow    2 files followed, 600 B (oldest unread byte ~30s old) behind the input")
	assert.Regexp(t, `(?m)^t-behind\s+leased\s.*600 B \(30s behind\)`, out.String())
}

// A followed file's split shows its file's name now and the name it was
// found under, its lag measured against the file's size now, the files
// waiting for a lane, and why a completed one completed.
func TestInspectionNamesFollowedFilesAndTheirLag(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "app.log"), bytes.Repeat([]byte("x\n"), 50), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "new.log"), bytes.Repeat([]byte("y\n"), 20), 0o644))
	tail := func(id, found string, p *spate.SplitProgress, lease string) spate.SplitState {
		fid, err := filesource.Identify(filepath.Join(dir, found))
		require.NoError(t, err)
		desc, err := json.Marshal(filesource.Descriptor{Version: filesource.PackingVersion, Tail: &filesource.Tail{Name: found, FileID: fid}})
		require.NoError(t, err)
		return spate.SplitState{ID: spate.MustSplitID(id), Status: spate.StatusRunnable, LeaseOwner: lease, Owner: lease,
			HasSpec: true, Weight: 1, Descriptor: desc, Progress: p, WrittenAt: time.Now()}
	}
	app := tail("t-app", "app.log", &spate.SplitProgress{Watermark: 60, State: []byte(`{"size":60}`)}, "w1")
	waiting := tail("t-new", "new.log", nil, "")
	gone := tail("t-gone", "app.log", &spate.SplitProgress{Watermark: 9, Completed: true, State: []byte(`{"size":9,"name":"app.log.1","end":"deleted"}`)}, "")
	gone.Status = spate.StatusCompleted
	require.NoError(t, os.Rename(filepath.Join(dir, "app.log"), filepath.Join(dir, "app.log.1")))
	app.Progress.State = []byte(`{"size":60,"name":"app.log.1"}`) // its lane saw the rename
	require.NoError(t, os.WriteFile(filepath.Join(dir, "idle.log"), []byte("z\n"), 0o644))
	idle := tail("t-idle", "idle.log", &spate.SplitProgress{Watermark: 2, Parked: true, State: []byte(`{"size":2}`)}, "w2")
	js := &spate.JobState{Plan: spate.PlanState{Fingerprint: "fp", Finality: spate.PlanOpen, Planned: 4},
		Splits: []spate.SplitState{app, gone, waiting, idle}}

	in := inspectionOf("job", "store", js, filesource.NewLagMeter(dir).Measure(js.Splits))
	assert.Equal(t, 3, in.Summary.Followed)
	assert.Equal(t, 2, in.Summary.Leased)
	assert.Equal(t, 1, in.Summary.Parked)
	assert.Equal(t, 1, in.Summary.Waiting)
	assert.Equal(t, int64(40+40), in.Summary.Lag, "app.log.1 holds 100 B, 60 committed; new.log's 40 B wait")
	byID := map[string]splitJSON{}
	for _, sp := range in.Splits {
		byID[sp.ID] = sp
	}
	assert.Equal(t, "app.log.1", byID["t-app"].File)
	assert.Equal(t, "app.log", byID["t-app"].Found)
	assert.Equal(t, ptr(int64(40)), byID["t-app"].LagBytes)
	assert.Equal(t, "new.log", byID["t-new"].File)
	assert.Equal(t, ptr(int64(40)), byID["t-new"].LagBytes)
	assert.Equal(t, "app.log.1", byID["t-gone"].File)
	assert.Contains(t, byID["t-gone"].End, "deleted")
	assert.Equal(t, "parked", byID["t-idle"].State, "an idle followed file's split shown as running")
	assert.Equal(t, "idle.log", byID["t-idle"].File)

	var out bytes.Buffer
	printInspection(&out, in)
	assert.Contains(t, out.String(), "follow    3 files followed (1 waiting for a lane), 80 B")
	assert.Contains(t, out.String(), "2 leased (1 running, 1 parked: idle files, no lane)")
	assert.Regexp(t, `(?m)^t-idle\s+parked\s.*idle\.log$`, out.String())
	assert.Regexp(t, `(?m)^t-app\s+leased\s.*40 B.*app\.log\.1 \(found as app\.log\)$`, out.String())
	assert.Regexp(t, `(?m)^t-new\s+runnable\s.*new\.log$`, out.String())
	b, err := json.Marshal(in)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"file":"app.log.1","found":"app.log"`)
	assert.Contains(t, string(b), `"lag_bytes":40`)
	assert.Contains(t, string(b), `"parked":1`)
}
