package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// followViewChromium is Debian's chromium, which .ci/run installs; under
// CI=true its absence fails the test.
func followViewChromium(t *testing.T) string {
	for _, p := range []string{os.Getenv("SPATE_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if p != "" {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	if os.Getenv("CI") == "true" {
		require.FailNow(t, "no chromium (apt-get install -y chromium): the followed job's page test cannot run")
	}
	t.Skip("no chromium; install Debian's chromium to run the followed job's page test")
	return ""
}

// A followed job as its operator sees it mid-run: one worker with two
// lanes follows three growing files, so one waits for a lane; a file is
// rotated (renamed, a new one at its name). /metrics carries a lag series
// per file by its path now and counts the waiting file; the job page, in
// a real browser, names each split's file and shows its lag, and its
// timeline holds the gains made before the page was first opened. The
// page's screenshot is docs/images/ui-job.png (SPATE_SCREENSHOTS=DIR).
func TestFollowedJobPageShowsFilesAndLag(t *testing.T) {
	bin := followViewChromium(t)
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	in := newFollowInput(t, src)
	for _, n := range []string{"app1", "app2", "app3"} {
		in.add(n+".log", n, 200)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	p := start(t, dir, "", "backfill", "--follow", "--src", src, "--dst", dst, "--job", "follow-view", "--instance", "w0",
		"--lease", "2s", "--lanes", "2", "--store", "mem://", "--metrics-addr", addr)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			for _, n := range []string{"app1", "app2", "app3"} {
				in.add(n+".log", n, 3)
			}
			if i == 50 { // a rotation: app2.log renamed, a new one at its name
				in.reopen("app2.log")
				require.NoError(t, os.Rename(filepath.Join(src, "app2.log"), filepath.Join(src, "app2.log.1")))
			}
		}
	})
	defer func() { close(stop); wg.Wait() }()

	metrics := func() string {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	waiting := regexp.MustCompile(`(?m)^spate_follow_files\{state="waiting"\} [1-9]`)
	var m string
	require.Eventually(t, func() bool {
		m = metrics()
		return waiting.MatchString(m) && strings.Contains(m, `spate_follow_lag_bytes{file="app2.log.1"}`) &&
			strings.Contains(m, `spate_follow_lag_seconds{file="app3.log"}`)
	}, time.Minute, 200*time.Millisecond, "no lag series for the followed files:\n%s\n%s", m, p.stderr.String())
	for _, line := range strings.Split(m, "\n") {
		if strings.HasPrefix(line, "spate_follow_") {
			t.Log(line)
		}
	}
	assert.NotRegexp(t, `spate_follow_lag_bytes\{file="app2\.log"\}.*\n(?s:.*)spate_follow_lag_bytes\{file="app2\.log"\}`, m, "one series per file")

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(bin),
		chromedp.Flag("no-sandbox", true), chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-quic", true),
		chromedp.WindowSize(1400, 1100))
	actx, cancel := chromedp.NewExecAllocator(t.Context(), opts...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate("http://"+addr+"/ui/jobs/follow-view"),
		chromedp.WaitVisible(`//span[@id="live"][starts-with(text(),"live")]`),
		chromedp.WaitVisible(`//table[@id="splits"]//td[contains(., "app1.log")]`),
		chromedp.WaitVisible(`//table[@id="splits"]//td[contains(., "app3.log")]`),
		chromedp.WaitVisible(`//table[@id="splits"]//td[contains(., "app2.log.1")][contains(., "found as app2.log")]`),
		// A file waiting for a lane shows its bytes and how long they wait.
		chromedp.WaitVisible(`//table[@id="splits"]//tr[contains(@class, "runnable")]/td[7][contains(., "behind")]`),
		// The gains were made before this page opened: the view kept them.
		chromedp.WaitVisible(`//ul[@id="timeline"]/li[contains(., "gained")]`),
	))
	state, err := chromedp.Run(ctx, chromedp.Text(`#sum-state`))
	require.NoError(t, err)
	assert.Equal(t, "following", state, "the page names the state as the CLI does")
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(90))
	require.NoError(t, err)
	out := os.Getenv("SPATE_SCREENSHOTS")
	if out == "" {
		out = t.TempDir()
	}
	require.NoError(t, os.WriteFile(filepath.Join(out, "ui-job.png"), png, 0o644))
}
