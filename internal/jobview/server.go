// Package jobview is spate's live job view: a read-only web page per job,
// served by `spate ui` and at /ui on the long-running commands'
// --metrics-addr.
//
// A page is rendered on the server with html/template from one read of
// the job's store, so it is a complete snapshot with JavaScript disabled.
// With JavaScript, the page's own small script follows server-sent events
// and updates the rows that changed without a reload. Each event's id is
// the store revision its view includes: a browser that reconnects sends
// it back (Last-Event-ID) and gets only what followed when nothing was
// missed, the whole view again otherwise. Every page of one job shares one
// reader of it (a hub): one watch per keyspace and one read per refresh,
// whatever the number of pages.
//
// The view never writes: it has no mutating endpoint, answers only GET
// and HEAD, and shows the store URL redacted. Every value read from the
// store is escaped by html/template on the server and set as text (never
// as markup) by the script.
package jobview

import (
	"bytes"
	"context"
	"crypto/subtle"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/humanize"
	"github.com/spate-go/spate/storeurl"
)

// Opener reaches the jobs the view shows.
type Opener interface {
	// Jobs lists the jobs the store holds, sorted.
	Jobs(ctx context.Context) ([]string, error)
	// Open opens a store over job's keys; the view closes it.
	Open(ctx context.Context, job string) (spate.Store, error)
}

// Config configures a [Server].
type Config struct {
	Opener Opener
	// Store describes the store on the pages; it must already be redacted
	// (storeurl.Redact).
	Store string
	// Base is the path the view is mounted at ("" or "/ui").
	Base string
	// Token, when set, is required of every request, as HTTP basic auth
	// (any user name, the token as password) or a bearer token.
	Token string
	// Refresh is the least time between two reads of a job (default 250ms).
	Refresh time.Duration
	// RowLimit bounds the split rows a page renders (default 500); the
	// page says how many it left out, and filters narrow it.
	RowLimit int
	Log      *slog.Logger
	// Lag, when set, is the followed files' lag as the process serving
	// the view measures it (a --follow worker looks at the files), by
	// split id: their rows show it rather than what the last commits
	// recorded, a file waiting for a lane included.
	Lag func() map[string]Lag
}

// Lag is a followed file's lag: the bytes it holds beyond its committed
// output, and since when its oldest unread byte waits (zero: none).
type Lag struct {
	Bytes int64
	Since time.Time
}

// Server serves the job view. It is an http.Handler.
type Server struct {
	cfg  Config
	mux  *http.ServeMux
	mu   sync.Mutex
	hubs map[string]*hub
}

//go:embed page.tmpl
var pageFS embed.FS

var pages = template.Must(template.New("").Funcs(template.FuncMap{
	"bytes": humanize.Bytes,
	"ago": func(ms int64) string {
		if ms == 0 {
			return ""
		}
		return age(time.Since(time.UnixMilli(ms))) + " ago"
	},
	"behind": func(ms int64) string { return age(time.Since(time.UnixMilli(ms))) + " behind" },
	"rate":   func(bps float64) string { return humanize.Bytes(int64(bps)) + "/s" },
}).ParseFS(pageFS, "page.tmpl"))

// New returns a view over cfg.Opener's jobs.
func New(cfg Config) *Server {
	if cfg.Refresh <= 0 {
		cfg.Refresh = 250 * time.Millisecond
	}
	if cfg.RowLimit <= 0 {
		cfg.RowLimit = 500
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	cfg.Base = strings.TrimRight(cfg.Base, "/")
	s := &Server{cfg: cfg, mux: http.NewServeMux(), hubs: map[string]*hub{}}
	s.mux.HandleFunc("GET /{$}", s.jobs)
	s.mux.HandleFunc("GET /jobs/{job}", s.jobPage)
	s.mux.HandleFunc("GET /jobs/{job}/events", s.events)
	s.mux.HandleFunc("GET /jobs/{job}/splits/{split}", s.splitPage)
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	// The page's only script is its own, inline; nothing else runs.
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.Set("Allow", "GET, HEAD")
		http.Error(w, "the job view is read-only", http.StatusMethodNotAllowed)
		return
	}
	if s.cfg.Token != "" && !s.authorized(r) {
		h.Set("WWW-Authenticate", `Basic realm="spate job view", charset="UTF-8"`)
		http.Error(w, "this job view needs its token (as the password of HTTP basic auth, or a bearer token)", http.StatusUnauthorized)
		return
	}
	path := r.URL.Path
	if s.cfg.Base != "" {
		rest, ok := strings.CutPrefix(path, s.cfg.Base)
		if !ok {
			http.NotFound(w, r)
			return
		}
		if rest == "" {
			http.Redirect(w, r, s.cfg.Base+"/", http.StatusFound)
			return
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path = rest
		r = r2
	}
	s.mux.ServeHTTP(w, r)
}

func (s *Server) authorized(r *http.Request) bool {
	got := ""
	if _, pw, ok := r.BasicAuth(); ok {
		got = pw
	} else if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		got = b
	}
	return subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.Token)) == 1
}

// Close stops every job's reader.
func (s *Server) Close() error {
	s.mu.Lock()
	hubs := s.hubs
	s.hubs = map[string]*hub{}
	s.mu.Unlock()
	for _, h := range hubs {
		h.close()
	}
	return nil
}

// Follow starts reading job now, so that its first page does not wait
// for the job's first read (BenchmarkViewColdPage: about 0.6 s for
// 100,000 splits on stores/mem, 2 cores): for a server started for one
// job.
func (s *Server) Follow(ctx context.Context, job string) error {
	_, err := s.hubOf(ctx, job)
	return err
}

// hubOf returns job's reader, starting it on first use.
func (s *Server) hubOf(ctx context.Context, job string) (*hub, error) {
	if err := storeurl.ValidateJob(job); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.hubs[job]; h != nil {
		return h, nil
	}
	st, err := s.cfg.Opener.Open(ctx, job)
	if err != nil {
		return nil, fmt.Errorf("open job %s: %w", job, err)
	}
	h := newHub(job, st, s.cfg.Log, s.cfg.Refresh, s.cfg.Lag)
	s.hubs[job] = h
	return h, nil
}

type jobsData struct {
	Base, Store string
	Jobs        []string
	Err         string
}

func (s *Server) jobs(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	d := jobsData{Base: s.cfg.Base, Store: s.cfg.Store}
	jobs, err := s.cfg.Opener.Jobs(ctx)
	if err != nil {
		d.Err = err.Error()
	}
	d.Jobs = jobs
	s.render(w, "jobs", d)
}

type jobData struct {
	Base, Store, Job, Rev string
	V                     *view
	Rows                  []row
	Shown, Matching       int
	Quarantined           []row
	Timeline              []entry
	Chart                 chart
	Err                   string
	Filter                filter
	States, Owners        []string
}

type filter struct {
	State, Owner, Sort string
}

func (s *Server) jobPage(w http.ResponseWriter, r *http.Request) {
	job := r.PathValue("job")
	h, err := s.hubOf(r.Context(), job)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	v, rev, ch, tl, err := h.snapshot()
	d := jobData{Base: s.cfg.Base, Store: s.cfg.Store, Job: job, Rev: rev, V: v, Chart: ch}
	if err != nil {
		d.Err = err.Error()
	}
	q := r.URL.Query()
	d.Filter = filter{State: q.Get("state"), Owner: q.Get("owner"), Sort: q.Get("sort")}
	if v != nil {
		states, owners := map[string]bool{}, map[string]bool{}
		var match []row
		for _, x := range v.Splits {
			states[x.State] = true
			if x.Lease != "" {
				owners[x.Lease] = true
			}
			if x.State == "quarantined" {
				d.Quarantined = append(d.Quarantined, x)
			}
			if d.Filter.State != "" && x.State != d.Filter.State {
				continue
			}
			if d.Filter.Owner != "" && x.Lease != d.Filter.Owner && x.Owner != d.Filter.Owner {
				continue
			}
			match = append(match, x)
		}
		sortRows(match, d.Filter.Sort)
		d.Matching = len(match)
		d.Rows = match[:min(len(match), s.cfg.RowLimit)]
		d.Shown = len(d.Rows)
		d.States = slices.Sorted(maps.Keys(states))
		d.Owners = slices.Sorted(maps.Keys(owners))
	}
	for i := len(tl) - 1; i >= 0 && len(d.Timeline) < 50; i-- {
		d.Timeline = append(d.Timeline, tl[i])
	}
	s.render(w, "job", d)
}

// liveFirst ranks a row's state: the work under way first, then what
// waits, what needs an operator, and what is done.
var liveFirst = map[string]int{"leased": 0, "runnable": 1, "parked": 2, "quarantined": 3, "damaged": 4, "completed": 5}

func sortRows(rs []row, by string) {
	switch by {
	case "":
		// Live work first, by id within a state (rs is by id).
		slices.SortStableFunc(rs, func(a, b row) int { return liveFirst[a.State] - liveFirst[b.State] })
	case "left":
		slices.SortStableFunc(rs, func(a, b row) int { return int(b.Left - a.Left) })
	case "attempts":
		slices.SortStableFunc(rs, func(a, b row) int { return int(b.Attempts) - int(a.Attempts) })
	case "owner":
		slices.SortStableFunc(rs, func(a, b row) int { return strings.Compare(a.Lease, b.Lease) })
	}
}

func (s *Server) render(w http.ResponseWriter, name string, data any) {
	var b bytes.Buffer
	if err := pages.ExecuteTemplate(&b, name, data); err != nil {
		s.cfg.Log.Error("job view: cannot render the page", "page", name, "error", err)
		http.Error(w, "cannot render the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = b.WriteTo(w)
}

// events streams a job's changes as server-sent events.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming is not supported here", http.StatusInternalServerError)
		return
	}
	h, err := s.hubOf(r.Context(), r.PathValue("job"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	since := r.Header.Get("Last-Event-ID")
	if since == "" {
		since = r.URL.Query().Get("since")
	}
	if _, err := strconv.ParseUint(since, 10, 64); err != nil {
		since = ""
	}
	ch, first := h.subscribe(since)
	defer h.unsubscribe(ch)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	send := func(ev event) error {
		if _, err := fmt.Fprintf(w, "id: %s\ndata: %s\n\n", ev.id, ev.data); err != nil {
			return err
		}
		fl.Flush()
		return nil
	}
	_, _ = fmt.Fprint(w, "retry: 1000\n\n")
	fl.Flush()
	if first != nil && send(*first) != nil {
		return
	}
	ping := time.NewTicker(15 * time.Second)
	defer ping.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case ev, ok := <-ch:
			if !ok {
				return // too slow: the browser reconnects
			}
			if send(ev) != nil {
				return
			}
		case <-ping.C:
			if _, err := fmt.Fprint(w, ": ping\n\n"); err != nil {
				return
			}
			fl.Flush()
		}
	}
}

// ErrNotLoopback is returned by [CheckAddr] for an address that is not on
// the loopback interface while no token is set.
var ErrNotLoopback = errors.New("the job view listens on loopback only unless it has a token")

// CheckAddr refuses to serve the view beyond this machine without a
// token: addr's host must be a loopback address or localhost.
func CheckAddr(addr string, token string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q: want host:port (%v)", addr, err)
	}
	if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
		return nil
	}
	if token == "" {
		return fmt.Errorf("%w: %s is reachable from other machines; listen on 127.0.0.1, or give it a token (spate ui --ui-token-file, or SPATE_UI_TOKEN; never in a URL)", ErrNotLoopback, addr)
	}
	return nil
}

type splitData struct {
	Base, Store, Job, Rev string
	Row                   row
	History               []entry
}

// splitPage is one split's page: its row in full and its own timeline
// (what this view has seen of it), with the command that requeues it
// when it is quarantined.
func (s *Server) splitPage(w http.ResponseWriter, r *http.Request) {
	job, id := r.PathValue("job"), r.PathValue("split")
	if _, err := spate.NewSplitID(id); err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	h, err := s.hubOf(r.Context(), job)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	row, hist, rev, ok := h.splitPage(id)
	if !ok {
		http.Error(w, fmt.Sprintf("job %s has no split %s", job, id), http.StatusNotFound)
		return
	}
	s.render(w, "split", splitData{Base: s.cfg.Base, Store: s.cfg.Store, Job: job, Rev: rev, Row: row, History: hist})
}
