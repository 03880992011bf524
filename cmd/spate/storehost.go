package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spate-go/spate/internal/embedetcd"
)

// The default store is an embedded etcd that one spate process hosts and
// the others join (internal/embedetcd). This file holds what the processes
// do about that host: it records itself in the store, so that the others
// can name it; the others record that they use the store, so that the host
// does not leave before they have; and they watch that it still answers,
// so that a host that dies is reported, not waited on in silence.

// describeDefault describes the default store for people: this process
// hosting it records itself as its host; a process that joined it reads
// which process hosts it.
func (c *connector) describeDefault(ctx context.Context, dataDir string) {
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if c.local.Hosted() {
		command := ""
		if len(os.Args) > 1 {
			command = os.Args[1]
		}
		info := embedetcd.ThisProcess(c.embedAddr, dataDir, command)
		if err := c.local.RecordHost(rctx, info); err != nil {
			c.log.Warn("could not record this process as the default store's host; the processes that join it cannot name it", "error", err)
		}
		c.host = &info
		c.describe = fmt.Sprintf("embedded etcd at %s, hosted by this process (data in %s)", c.embedAddr, dataDir)
		return
	}
	c.describe = fmt.Sprintf("embedded etcd at %s, hosted by another spate process", c.embedAddr)
	if info, ok, err := c.local.ReadHost(rctx); err == nil && ok && info.Running() {
		c.host = &info
		c.describe = fmt.Sprintf("embedded etcd at %s, hosted by another spate process: %s, data in %s", c.embedAddr, info, info.DataDir)
	}
}

// noteInstance adds this worker's instance id to the host record of a
// default store this process hosts.
func (c *connector) noteInstance(ctx context.Context, instance string) {
	if !c.hosted() || c.host == nil {
		return
	}
	c.host.Instance = instance
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_ = c.local.RecordHost(rctx, *c.host)
}

// attend records this process as one that uses a default store another
// process hosts, until the returned leave is called: its host keeps the
// store up until then.
func (c *connector) attend(ctx context.Context, instance string) (leave func()) {
	if c.local == nil || c.hosted() {
		return func() {}
	}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	leave, err := c.local.Attend(rctx, instance)
	if err != nil {
		c.log.Warn("could not record this worker as one that uses the default store; its host may stop it before this worker has finished", "error", err)
		return func() {}
	}
	return leave
}

// storeGoneError is a default store whose host is gone.
type storeGoneError struct {
	store   string // where it serves
	host    string // the process that hosted it, "" when unknown
	since   time.Time
	wait    time.Duration
	fix     string
	expired bool   // the wait ran out
	other   string // another store answers there now (its host)
}

func (e *storeGoneError) Error() string {
	host := ""
	if e.host != "" {
		host = ", hosted by " + e.host
	}
	since := e.since.Format(time.TimeOnly)
	switch {
	case e.other != "":
		return fmt.Sprintf("the default store (%s%s) went away at %s and another store, %s, answers there now: this worker stopped without handing its splits back, so as not to run the job on a store that does not hold it; to resume the job: %s",
			e.store, host, since, e.other, e.fix)
	case e.expired:
		return fmt.Sprintf("the default store (%s%s) is gone since %s and nobody brought it back within %v (--connect-timeout): this worker stopped without handing its splits back (their leases went with the store); to resume the job: %s",
			e.store, host, since, e.wait, e.fix)
	}
	return fmt.Sprintf("the default store (%s%s) is gone since %s: this worker stopped without handing its splits back (their leases went with the store); to resume the job: %s",
		e.store, host, since, e.fix)
}

// storeWatch watches, from a worker that joined a default store another
// process hosts, that the store still answers. A store that stops
// answering is reported in one ERROR line within a lease, naming it, its
// host and what to run; a store that stays away for --connect-timeout
// more stops the worker (expire), which then exits non-zero.
type storeWatch struct {
	conn  *connector
	log   *slog.Logger
	lease time.Duration
	wait  time.Duration
	fix   string
	gone  atomic.Pointer[storeGoneError]
}

// err is the store's loss while it lasts (or once it stopped the worker),
// nil while it answers.
func (w *storeWatch) err() error {
	if w == nil {
		return nil
	}
	if e := w.gone.Load(); e != nil {
		return e
	}
	return nil
}

// watchStore starts watching the default store (when this process joined
// one another process hosts) until ctx ends; expire is called once if the
// store stays away for the whole wait. fix is what to run to bring it
// back.
func (c *connector) watchStore(ctx context.Context, log *slog.Logger, lease, wait time.Duration, fix string, expire func()) *storeWatch {
	if c.local == nil || c.hosted() {
		return nil
	}
	w := &storeWatch{conn: c, log: log, lease: lease, wait: wait, fix: fix}
	go w.run(ctx, expire)
	return w
}

func (w *storeWatch) run(ctx context.Context, expire func()) {
	interval := max(w.lease/4, 250*time.Millisecond)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var downSince time.Time
	for {
		pctx, cancel := context.WithTimeout(ctx, max(w.lease/2, time.Second))
		ok, perr := embedetcd.Probe(pctx, w.conn.embedAddr)
		cancel()
		if ctx.Err() != nil {
			return
		}
		now := time.Now()
		if ok {
			downSince = time.Time{}
			if e := w.gone.Load(); e != nil {
				if other := w.otherHost(ctx); other != "" {
					e := *e
					e.other = other
					w.gone.Store(&e)
					w.log.Error("another store answers where the default store was: stopping this worker", "store", w.conn.embedAddr, "now_hosted_by", other, "fix", w.fix)
					expire()
					return
				}
				w.gone.Store(nil)
				w.log.Warn("the default store is back: this worker goes on", "store", w.conn.describe)
			}
		} else {
			if downSince.IsZero() {
				downSince = now
			}
			// Nothing listening is a host that is gone; a listener that
			// does not answer may be one that is only slow: it gets a
			// whole lease.
			grace := w.lease / 2
			if perr != nil {
				grace = w.lease
			}
			e := w.gone.Load()
			switch {
			case e == nil && now.Sub(downSince) >= grace:
				w.report(downSince, perr)
			case e != nil && now.Sub(downSince) >= grace+w.wait:
				e := *e
				e.expired = true
				w.gone.Store(&e)
				expire()
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// report says, in one ERROR line, that the store is gone.
func (w *storeWatch) report(since time.Time, perr error) {
	e := &storeGoneError{store: "embedded etcd at " + w.conn.embedAddr, since: since, wait: w.wait, fix: w.fix}
	what := "nothing answers there: the process that hosted it exited or was killed"
	if perr != nil {
		what = "it does not answer: the process that hosts it is frozen, overloaded or dying"
	}
	hostedBy, dataDir := "unknown (a spate process started before it recorded its host)", "unknown"
	if h := w.conn.host; h != nil {
		e.host = h.String()
		hostedBy, dataDir = e.host, h.DataDir
	}
	w.gone.Store(e)
	w.log.Error("the default store is gone: "+what+"; this worker can neither commit nor hand back anything until it is back",
		"store", e.store, "hosted_by", hostedBy, "data_dir", dataDir, "since", since.Format(time.TimeOnly),
		"fix", w.fix, "exits_in", w.wait)
}

// otherHost names the host of the store that answers now when it serves
// another data directory than the store that went away, "" otherwise.
func (w *storeWatch) otherHost(ctx context.Context) string {
	was := w.conn.host
	if was == nil {
		return ""
	}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	now, ok, err := w.conn.local.ReadHost(rctx)
	if err != nil || !ok || now.DataDir == was.DataDir {
		return ""
	}
	return fmt.Sprintf("%s, data in %s", now, now.DataDir)
}

// restartCommand is the command that brings a lost default store back:
// this worker's job, on the data directory the store was hosted from.
func (f *backfillFlags) restartCommand(conn *connector, job, src, dst string) string {
	dataDir := f.store.dataDir
	if conn.host != nil && conn.host.DataDir != "" {
		dataDir = conn.host.DataDir
	}
	parts := []string{"spate backfill --src", shellQuote(src), "--dst", shellQuote(dst), "--job", job, "--data-dir", shellQuote(dataDir)}
	if f.store.embedAddr != embedetcd.DefaultClientAddr {
		parts = append(parts, "--embed-addr", f.store.embedAddr)
	}
	parts = append(parts, "--lease", f.lease.String())
	if f.publish != "" && !isBucketURL(f.dst) && f.publish != publishComplete { // the command's default (no --follow)
		parts = append(parts, "--publish", f.publish)
	}
	return strings.Join(parts, " ") + " (any worker of the job started on that data directory restarts the store from its data)"
}

// shellQuote quotes s for a shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@%+,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
