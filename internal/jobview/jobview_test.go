package jobview_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/jobview"
	"github.com/spate-go/spate/internal/needs"
	"github.com/spate-go/spate/stores/mem"
)

// xss is markup a store can hold where the view shows text: the plan's
// fingerprint is free text a planner chooses.
const xss = `fp<script>window.__xss=1</script><img src=x onerror="window.__xss=2">`

type planner struct{ n int }

func (p planner) Fingerprint() string { return xss }

func (p planner) Plan(context.Context, spate.PlanContext) (spate.SplitPlan, error) {
	var ss []spate.PlannedSplit
	for i := range p.n {
		id := spate.MustSplitID(fmt.Sprintf("part-%02d", i))
		ss = append(ss, spate.NewPlannedSplit(spate.NewSplitSpec(id, nil).WithWeight(1000)))
	}
	return spate.NewSplitPlan(ss, spate.PlanFinal), nil
}

// worker is one coordinator of the test's job, on its own store handle.
type worker struct {
	c    *spate.StoreCoordinator
	held map[spate.SplitID]spate.LeaseEpoch
}

func startWorker(t *testing.T, store *mem.Store, id string, n int) *worker {
	t.Helper()
	h, err := store.Connect()
	require.NoError(t, err)
	cfg := spate.TimingsForLease(time.Second)
	cfg.InstanceID = id
	cfg.RebalanceDelay = spate.NoRebalanceDelay
	c, err := spate.NewStoreCoordinator(h, cfg, spate.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	c.SetWaker(spate.NewWaker())
	require.NoError(t, c.Start(planner{n: n}))
	t.Cleanup(func() { _ = c.Abandon(); _ = h.Close() })
	return &worker{c: c, held: map[spate.SplitID]spate.LeaseEpoch{}}
}

// poll folds the worker's events until cond holds.
func (w *worker) pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "timed out waiting until %s", what)
		evs, err := w.c.Poll()
		require.NoError(t, err)
		for _, ev := range evs {
			switch e := ev.(type) {
			case spate.Gained:
				w.held[e.Split.ID] = e.Epoch
			case spate.Lost:
				delete(w.held, e.Split)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type opener struct{ store *mem.Store }

func (o opener) Jobs(context.Context) ([]string, error) { return []string{"job-a"}, nil }
func (o opener) Open(_ context.Context, job string) (spate.Store, error) {
	if job != "job-a" {
		return nil, fmt.Errorf("no job %q", job)
	}
	return o.store.Connect()
}

func newView(t *testing.T, store *mem.Store, cfg jobview.Config) *httptest.Server {
	cfg.Opener = opener{store}
	cfg.Store = "mem (test)"
	cfg.Log = slog.New(slog.DiscardHandler)
	v := jobview.New(cfg)
	srv := httptest.NewServer(v)
	t.Cleanup(func() { srv.Close(); _ = v.Close() })
	return srv
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// The job page is a complete snapshot: every split's row, the plan, the
// members; what the store holds is escaped; the view writes nothing.
func TestJobPageIsAnEscapedReadOnlySnapshot(t *testing.T) {
	store := mem.MustNew(mem.Options{TTL: time.Second})
	t.Cleanup(func() { _ = store.Close() })
	w := startWorker(t, store, "w1", 4)
	w.pollUntil(t, "w1 holds every split", func() bool { return len(w.held) == 4 })
	srv := newView(t, store, jobview.Config{})

	code, body := get(t, srv.URL+"/")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `href="/jobs/job-a"`)

	code, body = get(t, srv.URL+"/jobs/job-a")
	require.Equal(t, http.StatusOK, code)
	for i := range 4 {
		assert.Contains(t, body, fmt.Sprintf(`id="s-part-%02d"`, i))
	}
	assert.Contains(t, body, "w1")
	assert.NotContains(t, body, "<script>window.__xss", "store values must be escaped")
	assert.NotContains(t, body, `<img src=x`, "store values must be escaped")
	assert.Contains(t, body, "&lt;script&gt;window.__xss=1&lt;/script&gt;")

	// A split its source fails until it is quarantined: the page lists it
	// with the reason it was set aside (escaped) and its requeue command.
	poison := spate.MustSplitID("part-00")
	for range spate.DefaultMaxAttempts {
		w.pollUntil(t, "w1 holds part-00", func() bool { _, ok := w.held[poison]; return ok })
		require.NoError(t, w.c.Fail(t.Context(), poison, "bad row "+xss))
		delete(w.held, poison)
	}
	require.Eventually(t, func() bool {
		_, body = get(t, srv.URL+"/jobs/job-a")
		return strings.Contains(body, "spate requeue part-00 --job job-a")
	}, 10*time.Second, 50*time.Millisecond, "the quarantined split never showed")
	assert.Contains(t, body, "bad row fp&lt;script&gt;window.__xss=1&lt;/script&gt;", "the quarantine's reason, escaped")
	assert.NotContains(t, body, "<script>window.__xss", "store values must be escaped")
	assert.Contains(t, body, `href="/jobs/job-a/splits/part-00"`, "a split's row links to its page")

	// The split's own page: its row in full, its history as this view saw
	// it, the reason and the requeue command.
	code, body = get(t, srv.URL+"/jobs/job-a/splits/part-00")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "<td>quarantined</td>")
	assert.Contains(t, body, "bad row fp&lt;script&gt;window.__xss=1&lt;/script&gt;")
	assert.NotContains(t, body, "<script>window.__xss", "store values must be escaped")
	assert.Contains(t, body, "spate requeue part-00 --job job-a")
	assert.Regexp(t, `<li>[0-9:.]+ quarantined `, body, "the split's history records its quarantine")
	code, _ = get(t, srv.URL+"/jobs/job-a/splits/part-99")
	assert.Equal(t, http.StatusNotFound, code, "a split the job does not hold")
	code, _ = get(t, srv.URL+"/jobs/job-a/splits/no%3Cid%3E")
	assert.Equal(t, http.StatusNotFound, code, "an invalid split id")

	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
		req, err := http.NewRequest(m, srv.URL+"/jobs/job-a", nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, m)
	}
	resp, err := http.Get(srv.URL + "/jobs/no%3Cjob%3E")
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "an invalid job name is refused")
	assert.Contains(t, string(b), "must be 1-64 characters", "refused by its name, before any store is opened")
	// The refusal quotes the name, so it must never be taken for a page.
	assert.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain"), resp.Header.Get("Content-Type"))
	assert.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
}

// A token, when set, is asked of every request.
func TestTokenIsRequired(t *testing.T) {
	store := mem.MustNew(mem.Options{TTL: time.Second})
	t.Cleanup(func() { _ = store.Close() })
	srv := newView(t, store, jobview.Config{Token: "s3cret"})
	code, body := get(t, srv.URL+"/")
	assert.Equal(t, http.StatusUnauthorized, code)
	assert.NotContains(t, body, "s3cret")
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
	req.SetBasicAuth("ops", "s3cret")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	require.NoError(t, jobview.CheckAddr("127.0.0.1:8089", ""))
	require.NoError(t, jobview.CheckAddr("[::1]:8089", ""))
	require.ErrorIs(t, jobview.CheckAddr("0.0.0.0:8089", ""), jobview.ErrNotLoopback)
	require.ErrorIs(t, jobview.CheckAddr(":8089", ""), jobview.ErrNotLoopback)
	require.NoError(t, jobview.CheckAddr("0.0.0.0:8089", "s3cret"))
}

// A commit reaches a stream opened at the page's revision as a change of
// that split's row alone, under an event id that is a later store
// revision; a stream opened at a stale revision starts with the whole
// view.
func TestEventsCarryChangesUnderStoreRevisions(t *testing.T) {
	store := mem.MustNew(mem.Options{TTL: time.Second})
	t.Cleanup(func() { _ = store.Close() })
	w := startWorker(t, store, "w1", 4)
	w.pollUntil(t, "w1 holds every split", func() bool { return len(w.held) == 4 })
	srv := newView(t, store, jobview.Config{})
	code, body := get(t, srv.URL+"/jobs/job-a")
	require.Equal(t, http.StatusOK, code)
	rev := pageRev(t, body)

	events, _ := stream(t, srv.URL+"/jobs/job-a/events?since="+rev)
	split := spate.MustSplitID("part-02")
	require.NoError(t, w.c.CommitAt(t.Context(), split, w.held[split], spate.NewSplitProgress(600, nil)))
	ev := waitEvent(t, events, `"watermark":600`)
	assert.NotContains(t, ev.data, `"reset":true`, "a page at the current revision gets changes, not the whole view")
	assert.Contains(t, ev.data, `"id":"part-02"`)
	assert.NotContains(t, ev.data, `"id":"part-01"`, "an unchanged split is not sent")
	assert.Contains(t, ev.data, `"leader":"w1"`, "the leader line is live")
	assert.Contains(t, ev.data, `"workers":[{"name":"w1"`, "the throughput chart has a line per worker")
	got, err := strconv.ParseUint(ev.id, 10, 64)
	require.NoError(t, err, "the event id is a store revision")
	was, err := strconv.ParseUint(rev, 10, 64)
	require.NoError(t, err)
	assert.Greater(t, got, was, "the commit's event is at a later revision than the page")

	// A stream opened at a stale revision starts with the whole view.
	stale := firstEvent(t, srv.URL+"/jobs/job-a/events?since=1")
	assert.Contains(t, stale, `"reset":true`, "a stale page gets the whole view first")
	for i := range 4 {
		assert.Contains(t, stale, fmt.Sprintf(`"id":"part-%02d"`, i))
	}

	// A page a few updates behind (the one rendered before both commits)
	// resumes: it gets the rows changed since, no reset.
	split3 := spate.MustSplitID("part-03")
	require.NoError(t, w.c.CommitAt(t.Context(), split3, w.held[split3], spate.NewSplitProgress(300, nil)))
	waitEvent(t, events, `"id":"part-03"`)
	first := firstEvent(t, srv.URL+"/jobs/job-a/events?since="+rev)
	assert.NotContains(t, first, `"reset":true`, "a page a few updates behind got the whole view")
	assert.Contains(t, first, `"id":"part-02"`)
	assert.Contains(t, first, `"id":"part-03"`)
	assert.NotContains(t, first, `"id":"part-01"`, "a split unchanged since the page was sent")
}

// pageRev is the store revision a rendered job page shows.
func pageRev(t *testing.T, body string) string {
	t.Helper()
	m := regexp.MustCompile(`data-rev="([0-9]+)"`).FindStringSubmatch(body)
	require.NotNil(t, m, "the page carries no revision")
	return m[1]
}

// sse is one server-sent event: its id and data.
type sse struct{ id, data string }

// stream opens url's event stream. Its events arrive on the channel,
// which closes when the stream ends; the stream ends at cancel, or with
// the test.
func stream(t *testing.T, url string) (<-chan sse, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	ch := make(chan sse, 16)
	go func() {
		defer close(ch)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		var id string
		for sc.Scan() {
			line := sc.Text()
			if v, ok := strings.CutPrefix(line, "id: "); ok {
				id = v
			}
			if v, ok := strings.CutPrefix(line, "data: "); ok {
				select {
				case ch <- sse{id, v}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return ch, cancel
}

// waitEvent is the first event on ch whose data holds want ("": any),
// within 10 s.
func waitEvent(t *testing.T, ch <-chan sse, want string) sse {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			require.True(t, ok, "the event stream ended")
			if strings.Contains(ev.data, want) {
				return ev
			}
		case <-deadline:
			require.FailNow(t, fmt.Sprintf("no event carried %q within 10s", want))
		}
	}
}

// firstEvent is the data of the first event of url's stream.
func firstEvent(t *testing.T, url string) string {
	t.Helper()
	ch, cancel := stream(t, url)
	defer cancel()
	return waitEvent(t, ch, "").data
}

// A stale page of a job too large to send whole is told to reload (and
// is rendered afresh, its first 500 rows), not sent every row.
func TestAStalePageOfALargeJobReloads(t *testing.T) {
	store := mem.MustNew(mem.Options{TTL: time.Second})
	t.Cleanup(func() { _ = store.Close() })
	w := startWorker(t, store, "w1", 2500)
	w.pollUntil(t, "w1 holds splits", func() bool { return len(w.held) > 0 })
	srv := newView(t, store, jobview.Config{})
	var body string
	require.Eventually(t, func() bool {
		_, body = get(t, srv.URL+"/jobs/job-a")
		// Every split in the view: one that read the plan part-written
		// has fewer rows than the reload threshold, and rightly sends them.
		return strings.Contains(body, `<span id="sum-splits">2500</span>`)
	}, 10*time.Second, 50*time.Millisecond)
	assert.Equal(t, 500, strings.Count(body, `id="s-part-`), "the page renders its row limit")
	first := firstEvent(t, srv.URL+"/jobs/job-a/events?since=1")
	assert.Contains(t, first, `"reload":true`)
	assert.NotContains(t, first, `"splits":[`, "a large job's every row was sent")
	assert.Less(t, len(first), 64<<10)
}

// chromium is the browser the view's browser test drives: Debian's, which
// .ci/run installs. Under CI=true its absence fails the test.
func chromium(t *testing.T) string {
	for _, p := range []string{os.Getenv("SPATE_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	needs.Missing(t, "no chromium: install Debian's chromium (apt-get install -y chromium) to run the job view's browser test")
	return ""
}

// In a real headless browser: the page shows the running job; a commit in
// the store changes its row without a reload; a worker killed has its
// splits taken over, and the timeline says so; the markup the store holds
// stays inert; a screenshot is saved.
func TestJobPageInABrowser(t *testing.T) {
	bin := chromium(t)
	store := mem.MustNew(mem.Options{TTL: time.Second})
	t.Cleanup(func() { _ = store.Close() })
	w1 := startWorker(t, store, "w1", 6)
	w1.pollUntil(t, "w1 holds every split", func() bool { return len(w1.held) == 6 })
	srv := newView(t, store, jobview.Config{})

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(bin),
		chromedp.Flag("no-sandbox", true), chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-quic", true),
		chromedp.WindowSize(1280, 1000))
	actx, cancel := chromedp.NewExecAllocator(t.Context(), opts...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, 90*time.Second)
	defer cancel()

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(srv.URL+"/jobs/job-a"),
		chromedp.WaitVisible(`#s-part-03`),
		chromedp.WaitVisible(`//span[@id="live"][starts-with(text(),"live")]`),
	))
	stateText, err := chromedp.Run(ctx, chromedp.Text(`#sum-state`))
	require.NoError(t, err)
	assert.Equal(t, "running", stateText)

	// A commit changes its row without a reload.
	split := spate.MustSplitID("part-03")
	start := time.Now()
	require.NoError(t, w1.c.CommitAt(t.Context(), split, w1.held[split], spate.NewSplitProgress(500, nil)))
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(`//tr[@id="s-part-03"]/td[6][contains(., "50%")]`)))
	t.Logf("a commit reached the open page %v after it was written", time.Since(start).Round(time.Millisecond))

	// A second worker joins; the first is killed; its splits are taken over.
	w2 := startWorker(t, store, "w2", 6)
	require.NoError(t, w1.c.Abandon())
	w2.pollUntil(t, "w2 took over every split", func() bool { return len(w2.held) == 6 })
	require.NoError(t, chromedp.Do(ctx,
		chromedp.WaitVisible(`//ul[@id="timeline"]/li[contains(., "takeover")][contains(., "w2")]`),
		chromedp.WaitVisible(`//tr[@id="s-part-03"]/td[3][text()="w2"]`),
		chromedp.WaitVisible(`//b[@id="sum-leader"][text()="w2"]`),
		// w2 joined after the page opened: its heartbeats are seen live.
		chromedp.WaitVisible(`//table[@id="members"]//tr[td[1][text()="w2"]]/td[8][contains(text(),"s")][not(starts-with(text(),">"))]`),
	))
	// A split that completes moves after the live ones, without a reload.
	first := spate.MustSplitID("part-00")
	require.NoError(t, w2.c.CommitAt(t.Context(), first, w2.held[first], spate.CompletedProgress(1000, nil)))
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(`//table[@id="splits"]//tr[last()][@id="s-part-00"][@class="completed"]`)))
	order, err := chromedp.Run(ctx, chromedp.Evaluate[string](`Array.prototype.map.call(document.querySelectorAll('#splits tr[id]'), function (r) { return r.id; }).join(" ")`))
	require.NoError(t, err)
	assert.Equal(t, "s-part-01 s-part-02 s-part-03 s-part-04 s-part-05 s-part-00", order, "live work first, then what is done")
	linked, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector('#s-part-03 td a[href="/jobs/job-a/splits/part-03"]') !== null`))
	require.NoError(t, err)
	assert.True(t, linked, "a row updated live lost its link to the split's page")
	lines, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#wchart-lines polyline').length`))
	require.NoError(t, err)
	assert.Positive(t, lines, "the throughput chart drew no worker's line")

	// The page renders the ages it keeps up to date as the server renders
	// durations: rounded, seconds padded, never milliseconds. Two cells
	// of the page's kind are added: one written 2m01s ago, one whose
	// write time is ahead of this clock; the page's ticker fills them.
	require.NoError(t, chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`(function () {
		var t = document.createElement("table"), tr = t.insertRow(-1);
		var past = tr.insertCell(-1), ahead = tr.insertCell(-1);
		past.id = "probe-past"; past.setAttribute("data-written", String(Date.now() - 121000));
		ahead.id = "probe-ahead"; ahead.setAttribute("data-written", String(Date.now() + 3600000));
		document.body.appendChild(t);
	})()`),
		chromedp.WaitVisible(`//td[@id="probe-past"][contains(text(), "ago")]`),
		chromedp.WaitVisible(`//td[@id="probe-ahead"][contains(text(), "ago")]`)))
	past, err := chromedp.Run(ctx, chromedp.Text(`#probe-past`))
	require.NoError(t, err)
	assert.Regexp(t, `^2m\d\ds ago$`, past)
	ahead, err := chromedp.Run(ctx, chromedp.Text(`#probe-ahead`))
	require.NoError(t, err)
	assert.Equal(t, "0s ago", ahead)
	etas, err := chromedp.Run(ctx, chromedp.Evaluate[string](`Array.prototype.map.call(document.querySelectorAll('#splits tr[id] td:nth-child(9)'), function (td) { return td.textContent; }).join(" ")`))
	require.NoError(t, err)
	assert.NotRegexp(t, `ms|\.`, etas, "an ETA in milliseconds or with fractions")
	sumRate, err := chromedp.Run(ctx, chromedp.Text(`#sum-rate`))
	require.NoError(t, err)
	assert.NotRegexp(t, `\dms|\d\.\d+s`, sumRate, "the job's ETA in milliseconds or with fractions")

	// The markup the store holds is text: nothing ran.
	xssRan, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.__xss !== undefined`))
	require.NoError(t, err)
	assert.False(t, xssRan, "markup from the store ran in the page")

	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	dir := os.Getenv("SPATE_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ui-job.png"), png, 0o644))
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(`a[href="/jobs/job-a"]`)))
	png, err = chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ui-jobs.png"), png, 0o644))
}

// A worker that dies after a commit listing staged output leaves that
// output committed but unpublished until a new owner takes the split
// over: the view shows it pending, on the job's page and the split's.
func TestPendingPublishesShowUntilATakeover(t *testing.T) {
	store := mem.MustNew(mem.Options{TTL: time.Second})
	t.Cleanup(func() { _ = store.Close() })
	w1 := startWorker(t, store, "w1", 2)
	w1.pollUntil(t, "w1 holds every split", func() bool { return len(w1.held) == 2 })
	split := spate.MustSplitID("part-01")
	require.NoError(t, w1.c.CommitAt(t.Context(), split, w1.held[split],
		spate.SplitProgress{Watermark: 400, Output: []byte(`{"file":"part-01.out","len":400}`)}))
	srv := newView(t, store, jobview.Config{})
	_, body := get(t, srv.URL+"/jobs/job-a")
	assert.Contains(t, body, `id="sum-pending">0<`, "a live owner's output is not pending")

	require.NoError(t, w1.c.Abandon())
	require.Eventually(t, func() bool {
		_, body = get(t, srv.URL+"/jobs/job-a")
		return strings.Contains(body, `id="sum-pending">1<`)
	}, 10*time.Second, 50*time.Millisecond, "the dead owner's listed output never showed pending:\n%.3000s", body)
	assert.Contains(t, body, "runnable · publish pending")
	_, page := get(t, srv.URL+"/jobs/job-a/splits/part-01")
	assert.Contains(t, page, "<b>publish pending</b>")
	_, page = get(t, srv.URL+"/jobs/job-a/splits/part-00")
	assert.NotContains(t, page, "<b>publish pending</b>", "a split whose record lists no output")

	w2 := startWorker(t, store, "w2", 2)
	w2.pollUntil(t, "w2 took over", func() bool { return len(w2.held) == 2 })
	require.Eventually(t, func() bool {
		_, body = get(t, srv.URL+"/jobs/job-a")
		return strings.Contains(body, `id="sum-pending">0<`)
	}, 10*time.Second, 50*time.Millisecond, "the takeover did not clear the pending publish")
}
