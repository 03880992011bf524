package main

import (
	"context"
	"errors"
	"fmt"
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

It listens on loopback only unless given a token: --token-file FILE, or the
SPATE_UI_TOKEN environment variable; browsers then ask for it as a password.`

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

func runUI(args []string) int {
	fs := newFlagSet("ui", "[--store URL] [--job NAME] [--addr HOST:PORT]", uiAbout)
	var sf storeFlags
	var lf logFlags
	addr := fs.String("addr", "127.0.0.1:8089", "address to serve the view on")
	job := fs.String("job", "", "open this job's page at / (default: the jobs list)")
	tokenFile := fs.String("token-file", "", "file holding the token the view asks for (needed to listen beyond loopback)")
	sf.register(fs)
	lf.register(fs, "warn")
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	token := os.Getenv("SPATE_UI_TOKEN")
	if err := checkFlags(
		func() error { return noPositional(pos) },
		func() error { _, err := sf.validate(); return err },
		func() error {
			if *job == "" {
				return nil
			}
			if err := validateJob(*job); err != nil {
				return flagErrorf("--job: %v", err)
			}
			return nil
		},
		func() error {
			if *tokenFile == "" {
				return nil
			}
			b, err := os.ReadFile(*tokenFile)
			if err != nil {
				return flagErrorf("--token-file: %v", err)
			}
			token = strings.TrimSpace(string(b))
			if token == "" {
				return flagErrorf("--token-file: %s is empty", *tokenFile)
			}
			return nil
		},
		func() error {
			if err := jobview.CheckAddr(*addr, token); err != nil {
				return flagErrorf("--addr: %v", err)
			}
			return nil
		},
		lf.validate,
	); err != nil {
		return usageError(fs, "%v", err)
	}
	log, err := lf.logger(os.Stderr)
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	conn, err := sf.connectShared(log)
	if err != nil {
		return fail(exitFailed, "%v", err)
	}
	defer conn.close()
	view := jobview.New(jobview.Config{
		Opener: uiOpener{conn: conn, timeout: sf.connectTimeout, lease: 15 * time.Second},
		Store:  conn.describe, Token: token, Log: log,
	})
	defer view.Close()
	var h http.Handler = view
	if *job != "" {
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/" {
				http.Redirect(w, r, "/jobs/"+*job, http.StatusFound)
				return
			}
			view.ServeHTTP(w, r)
		})
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fail(exitFailed, "listen on %s: %v", *addr, err)
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
	fmt.Fprintf(os.Stderr, "spate ui: the jobs on %s at http://%s/\n", conn.describe, ln.Addr())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fail(exitFailed, "serve: %v", err)
	}
	return exitOK
}
