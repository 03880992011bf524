package main

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/humanize"
	"github.com/spate-go/spate/internal/jobview"
	"github.com/spate-go/spate/pipeline/filesource"
)

// maxLagSeries bounds the lag series /metrics carries: the files furthest
// behind get a series each (labelled by their path under --src as it is
// now), and the rest are summed into one, file="(other)". A file whose
// split completed (deleted, or the job's plan turned final) has no series:
// a job that rotates its logs for a year exposes what it follows now.
const maxLagSeries = 50

// otherFiles labels the sum of the files beyond maxLagSeries.
const otherFiles = "(other)"

// followLag is a followed job's lag, sampled from the job's records and
// the files under --src: for /metrics, the progress line and inspect.
type followLag struct {
	meter *filesource.LagMeter

	mu    sync.Mutex
	files []filesource.FileLag
	ok    bool // a sample was taken

	bytes, seconds, count *prometheus.Desc
}

func newFollowLag(root string) *followLag {
	return &followLag{
		meter: filesource.NewLagMeter(root),
		bytes: prometheus.NewDesc("spate_follow_lag_bytes",
			"Bytes a followed file holds beyond its committed output, per file (its path under --src now; the files beyond the "+
				fmt.Sprint(maxLagSeries)+" furthest behind are summed as file=\"(other)\"). A file whose split completed has no series.",
			[]string{"file"}, nil),
		seconds: prometheus.NewDesc("spate_follow_lag_seconds",
			"Age of a followed file's oldest byte not yet committed, at most (the time since it was last seen with nothing behind); 0 when caught up. Same files as spate_follow_lag_bytes; for (other), the oldest.",
			[]string{"file"}, nil),
		count: prometheus.NewDesc("spate_follow_files",
			"Followed files whose split is not complete, by state: following (a lane holds it) or waiting (for a lane).",
			[]string{"state"}, nil),
	}
}

// sample measures the files of js (nil: leaves the last sample).
func (l *followLag) sample(js *spate.JobState) []filesource.FileLag {
	if js == nil {
		return l.last()
	}
	files := l.meter.Measure(js.Splits)
	l.mu.Lock()
	l.files, l.ok = files, true
	l.mu.Unlock()
	return files
}

func (l *followLag) last() []filesource.FileLag {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.files
}

// view is the last sample for the job view, by split.
func (l *followLag) view() map[string]jobview.Lag {
	files := l.last()
	now := time.Now()
	out := make(map[string]jobview.Lag, len(files))
	for _, f := range files {
		v := jobview.Lag{Bytes: f.Bytes}
		if f.Age > 0 {
			v.Since = now.Add(-f.Age)
		}
		out[f.Split] = v
	}
	return out
}

func (l *followLag) Describe(ch chan<- *prometheus.Desc) {
	ch <- l.bytes
	ch <- l.seconds
	ch <- l.count
}

func (l *followLag) Collect(ch chan<- prometheus.Metric) {
	l.mu.Lock()
	files, ok := l.files, l.ok
	l.mu.Unlock()
	if !ok {
		return
	}
	following, waiting := 0, 0
	for _, f := range files {
		if f.Waiting {
			waiting++
		} else {
			following++
		}
	}
	ch <- prometheus.MustNewConstMetric(l.count, prometheus.GaugeValue, float64(following), "following")
	ch <- prometheus.MustNewConstMetric(l.count, prometheus.GaugeValue, float64(waiting), "waiting")
	for _, s := range lagSeries(files) {
		ch <- prometheus.MustNewConstMetric(l.bytes, prometheus.GaugeValue, float64(s.bytes), s.file)
		ch <- prometheus.MustNewConstMetric(l.seconds, prometheus.GaugeValue, s.age.Seconds(), s.file)
	}
}

type lagPoint struct {
	file  string
	bytes int64
	age   time.Duration
}

// lagSeries is the bounded set of series: the maxLagSeries-1 files
// furthest behind by name, and the others summed; a name two splits share
// (a file and its rotated predecessor caught between listings) is summed.
func lagSeries(files []filesource.FileLag) []lagPoint {
	byName := map[string]*lagPoint{}
	var pts []*lagPoint
	for _, f := range files {
		p := byName[f.Name]
		if p == nil {
			p = &lagPoint{file: f.Name}
			byName[f.Name] = p
			pts = append(pts, p)
		}
		p.bytes += f.Bytes
		p.age = max(p.age, f.Age)
	}
	if len(pts) > maxLagSeries {
		slices.SortFunc(pts, func(a, b *lagPoint) int {
			return cmp.Or(cmp.Compare(b.bytes, a.bytes), cmp.Compare(b.age, a.age), cmp.Compare(a.file, b.file))
		})
		other := &lagPoint{file: otherFiles}
		for _, p := range pts[maxLagSeries-1:] {
			other.bytes += p.bytes
			other.age = max(other.age, p.age)
		}
		pts = append(pts[:maxLagSeries-1], other)
	}
	out := make([]lagPoint, len(pts))
	for i, p := range pts {
		out[i] = *p
	}
	slices.SortFunc(out, func(a, b lagPoint) int { return cmp.Compare(a.file, b.file) })
	return out
}

// lagTotals condenses a sample for the progress line: files followed, how
// many wait for a lane, bytes behind and the oldest unread byte's age.
type lagTotals struct {
	files, waiting int
	bytes          int64
	age            time.Duration
}

func totalLag(files []filesource.FileLag) lagTotals {
	var t lagTotals
	for _, f := range files {
		t.files++
		if f.Waiting {
			t.waiting++
		}
		t.bytes += f.Bytes
		t.age = max(t.age, f.Age)
	}
	return t
}

// followingLine is the progress line of a followed job.
func followingLine(s jobSummary, t lagTotals, here string) string {
	waiting := ""
	if t.waiting > 0 {
		waiting = fmt.Sprintf(", %d waiting for a lane", t.waiting)
	}
	age := ""
	if t.age > 0 {
		about := "~"
		if t.age < time.Second {
			about = "" // "<1s"
		}
		age = fmt.Sprintf(" (oldest unread byte %s%s old)", about, humanize.Duration(t.age))
	}
	return fmt.Sprintf("following %d files%s (%d splits, %d completed): %s behind%s; %s",
		t.files, waiting, s.splits, s.completed, bytesStr(t.bytes), age, here)
}
