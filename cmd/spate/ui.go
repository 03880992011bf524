package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/jobview"
)

const uiAbout = `Serves a live, read-only view of the jobs on a store in the browser: a jobs list and,
for a job, its state, plan, members and every split (owner, epoch, progress, bytes
left, rate, ETA, attempts, age of the last write), the quarantined splits with the
command that requeues them, a progress chart and a timeline of gains, losses and
takeovers. Pages update without a reload (server-sent events) and are complete
snapshots with JavaScript disabled.

It listens on loopback only unless given a token: --ui-token-file FILE, or the
SPATE_UI_TOKEN environment variable; browsers then ask for it as a password.
That token guards the view; the store's own credentials are the store flags
(--token, --token-file, --password...), as on every command.`

// uiOpener opens the view's stores through the command's connector.
type uiOpener struct {
	conn    *connector
	timeout time.Duration
	lease   time.Duration
}

func (o uiOpener) Jobs(ctx context.Context) ([]string, error) { return o.conn.dep.Jobs(ctx) }

func (o uiOpener) Open(ctx context.Context, job string) (spate.Store, error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	ok, err := o.conn.dep.JobExists(ctx, job)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("no job %q on %s", job, o.conn.describe)
	}
	return o.conn.open(ctx, job, o.conn.readTTL(ctx, job, o.lease), o.timeout)
}

// uiFlags are the flags of spate ui.
type uiFlags struct {
	store     storeFlags
	log       logFlags
	addr      string
	job       string
	tokenFile string
	// token is the one the view asks for: SPATE_UI_TOKEN, or the content
	// of --ui-token-file (validate reads it). It is not the store's token:
	// --token-file is the store flag every command shares.
	token string
}

func (f *uiFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.addr, "addr", "127.0.0.1:8089", "address to serve the view on")
	fs.StringVar(&f.job, "job", "", "open this job's page at / (default: the jobs list)")
	fs.StringVar(&f.tokenFile, "ui-token-file", "", "file holding the token the view asks browsers for (needed to listen beyond loopback; or $SPATE_UI_TOKEN);\nnot the store's token (--token-file)")
	f.store.register(fs)
	f.log.register(fs, "warn")
}

func (f *uiFlags) validate(pos []string) error {
	f.token = os.Getenv("SPATE_UI_TOKEN")
	return checkFlags(
		func() error { return noPositional(pos) },
		func() error { _, err := f.store.validate(); return err },
		func() error {
			if f.job == "" {
				return nil
			}
			if err := validateJob(f.job); err != nil {
				return flagErrorf("--job: %v", err)
			}
			return nil
		},
		func() error {
			if f.tokenFile == "" {
				return nil
			}
			b, err := os.ReadFile(f.tokenFile)
			if err != nil {
				return flagErrorf("--ui-token-file: %v", err)
			}
			f.token = strings.TrimSpace(string(b))
			if f.token == "" {
				return flagErrorf("--ui-token-file: %s is empty", f.tokenFile)
			}
			return nil
		},
		func() error {
			if err := jobview.CheckAddr(f.addr, f.token); err != nil {
				return flagErrorf("--addr: %v", err)
			}
			return nil
		},
		f.log.validate,
	)
}

func runUI(args []string) int {
	fs := newFlagSet("ui", "[--store URL] [--job NAME] [--addr HOST:PORT]", uiAbout)
	var f uiFlags
	f.register(fs)
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if err := f.validate(pos); err != nil {
		return usageError(fs, "%v", err)
	}
	log, err := f.log.logger(os.Stderr)
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	conn, err := f.store.connectShared(log)
	if err != nil {
		return fail(exitFailed, "%v", err)
	}
	defer conn.close()
	view := jobview.New(jobview.Config{
		Opener: uiOpener{conn: conn, timeout: f.store.connectTimeout, lease: 15 * time.Second},
		Store:  conn.describe, Token: f.token, Log: log,
	})
	defer view.Close()
	var h http.Handler = view
	if f.job != "" {
		h = followAtRoot(view, f.job, log)
	}
	return serveUI(h, f.addr, conn.describe)
}

// followAtRoot reads the job from the start, so that its first page is
// served from a view already built, and redirects / to the job's page.
func followAtRoot(view *jobview.Server, job string, log *slog.Logger) http.Handler {
	fctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if err := view.Follow(fctx, job); err != nil {
		log.Warn("ui: cannot open the job yet; its page will say why", "job", job, "error", err)
	}
	cancel()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/" {
			http.Redirect(w, r, "/jobs/"+job, http.StatusFound)
			return
		}
		view.ServeHTTP(w, r)
	})
}

// serveUI serves h on addr until SIGINT or SIGTERM.
func serveUI(h http.Handler, addr, store string) int {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fail(exitFailed, "listen on %s: %v", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	fmt.Fprintf(os.Stderr, "spate ui: the jobs on %s at http://%s/\n", store, ln.Addr())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fail(exitFailed, "serve: %v", err)
	}
	return exitOK
}

// jobViewMount serves one job's view at /ui of a long-running command's
// --metrics-addr, beside /metrics, /healthz and /readyz. The view reads
// the store the command already holds open (no second connection, never
// a write). Safe by default, as `spate ui` is: on a loopback address it
// is open; beyond loopback it needs SPATE_UI_TOKEN, and without one /ui
// answers 403 saying so while the metrics stay served.
type jobViewMount struct {
	next http.Handler
	view *jobview.Server
	deny string // why /ui is refused on this address, or ""
}

func mountJobView(next http.Handler, addr, job string, st spate.Store, describe string, log *slog.Logger, lag func() map[string]jobview.Lag) *jobViewMount {
	token := os.Getenv("SPATE_UI_TOKEN")
	m := &jobViewMount{next: next}
	if err := jobview.CheckAddr(addr, token); err != nil {
		m.deny = fmt.Sprintf("the job view is not served on %s: %v (set SPATE_UI_TOKEN, or serve --metrics-addr on loopback)", addr, err)
		return m
	}
	m.view = jobview.New(jobview.Config{
		Opener: oneJob{job: job, st: spate.Decorate(st, unclosed{st})},
		Store:  describe, Base: "/ui", Token: token, Log: log, Lag: lag,
	})
	// The view reads the job from the worker's start, not from the first
	// page load: its history (a bounded ring: the chart's last 600
	// points, the timeline's last 500 entries) then holds what happened
	// before anyone looked, a kill and a takeover included.
	if err := m.view.Follow(context.Background(), job); err != nil {
		log.Warn("job view: cannot read the job yet; its page will say why", "job", job, "error", err)
	}
	return m
}

func (m *jobViewMount) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/ui" && !strings.HasPrefix(r.URL.Path, "/ui/") {
		m.next.ServeHTTP(w, r)
		return
	}
	if m.view == nil {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		http.Error(w, m.deny, http.StatusForbidden)
		return
	}
	m.view.ServeHTTP(w, r)
}

// close stops the view's readers (nil-safe).
func (m *jobViewMount) close() {
	if m != nil && m.view != nil {
		_ = m.view.Close()
	}
}

// oneJob is the view's opener over the one job this process runs.
type oneJob struct {
	job string
	st  spate.Store
}

func (o oneJob) Jobs(context.Context) ([]string, error) { return []string{o.job}, nil }

func (o oneJob) Open(_ context.Context, job string) (spate.Store, error) {
	if job != o.job {
		return nil, fmt.Errorf("this worker serves the view of job %s only, not %s (spate ui --store URL shows every job)", o.job, job)
	}
	return o.st, nil
}

// unclosed lends a store the command closes itself: the view's Close of
// it does nothing.
type unclosed struct{ spate.Store }

func (unclosed) Close() error { return nil }
