package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/embedetcd"
	"github.com/spate-go/spate/internal/jobview"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/blobsink"
	"github.com/spate-go/spate/pipeline/filesource"
)

// backfillFlags are the flags of spate backfill.
type backfillFlags struct {
	src, dst       string
	job            string
	instance       string
	lanes          int
	threads        int
	lease          time.Duration
	maxAttempts    int
	commitInterval time.Duration
	rollSize       int64         // bucket --dst: staged bytes that make a part
	rollInterval   time.Duration // bucket --dst: age that makes a part
	publish        string        // directory --dst: "commit" or "complete"
	drainTimeout   time.Duration
	rebalanceDelay time.Duration
	splitBytes     int64
	splitFiles     int
	minSplits      int
	maxLineBytes   int           // the line cap
	follow         bool          // a continuous job: discover and follow
	untilIdle      time.Duration // --follow: complete once the input is idle this long
	discover       time.Duration // --follow: the listing interval (0: the lease)
	retain         time.Duration // --follow: how long a completed split of a file that is gone is kept
	include        patternList   // --include: the files planned (all when empty)
	exclude        patternList   // --exclude: the files left out (--follow: default excludes when none)
	rate           float64
	history        string
	verify         bool
	quiet          bool
	metricsAddr    string
	store          storeFlags
	log            logFlags
}

const backfillAbout = `Copies every line of every file under --src into --dst, as one coordinated job
that any number of spate processes share: the leader splits the files into
leased splits, every worker takes its share, and a worker that dies has its
splits taken over and resumed from their last committed position.

A directory's regular files are read recursively. Symbolic links to regular
files are followed (the output names the link), and --src may itself be a link;
a link to a directory, or one whose target is missing, is refused. Other special
files (devices, pipes, sockets) are skipped.

Output: DST/<split>.out, one file per split whoever copied it, one line per
input line: "<path relative to SRC>:<byte offset of the line>\t<line>",
exactly once. A worker stages lines under DST/.spate/stage and publishes them
only after the commit that lists them won, so a killed or frozen worker
leaves no duplicate and no torn line under the final names. DST/.spate/job
names the job that owns DST (another job is refused), and DST/.spate/plan the
plan that writes it: a new plan of the job (on another store, or after its
records were deleted) is refused over its output, as is a worker whose --src,
--dst, --split-bytes, --split-files, --min-splits or --follow differ from
the job's.

The default store is an embedded etcd on --embed-addr with its data in
--data-dir; more spate backfill processes (other terminals) join it. The
process hosting it stays up until every other worker using it has exited. If
it dies, the others say so within a lease (one ERROR line: the store, its
host, the command to run) and exit 1 unless a worker started on the same
--data-dir brings the store back within --connect-timeout. Run it
again to resume an interrupted job; on a finished job it says so and exits 0.

With --follow the job is continuous: the plan stays open, the leader lists --src
every --discover for new files, and each file of a directory is followed as it
grows, by a split of its own named by the file's identity: a renamed file keeps
its split (a new file at its path gets another), a truncated file is read again
from its start, and a deleted file's split completes at the end of what it held;
each is logged with the file's name. A bucket's new objects are copied once
each. The job runs until SIGINT/SIGTERM (exit 0 after a graceful hand-back; a
later run resumes it), or with --until-idle D until no file was added, grown or
shrunk for D: the plan turns final, every file is read to its end, and the job
completes. Check a followed job's output with spate verify --expect.

A table: --src postgres://[user@]host[:port]/db?table=NAME reads a PostgreSQL
table in chunks of its key (the primary key, or ?key=COL: one unique, not-null
integer, text or uuid column), each chunk a split of ?chunk_rows=N rows
(default 100000; chunk ends found by probing the key, so sparse or skewed keys
still give even chunks) streamed by one COPY. ?columns=A,B picks the columns,
?where=EXPR (URL-escaped) filters the rows, ?max_row_bytes=N caps a row; these
and the table are part of the job's identity. --dst postgres://…?table=NAME2
writes the rows exactly once into a table of the source's shape (no primary
key needed): each flush is one transaction that copies the rows and advances
the split's fence row in spate_fence, which a zombie's older lease epoch no
longer matches; a table holding another job's fence rows is refused, and the
job's fence rows go once it completes. A directory or bucket --dst gets
<split>.out files of one row a line: "<key>\t<row>", the row's columns in
COPY text format (a tab or newline in a value escaped). The password comes
from ?password_file=FILE, $PGPASSWORD, ~/.pgpass or the URL, and is never
printed; other parameters (sslmode, ...) are the driver's. What a concurrent
writer may be seen: each chunk is read in one snapshot, different chunks at
different times. On completion the copy is verified: a table by the row count
and a checksum of every chunk, a directory row by row (see spate verify).

What is read: every file under --src that matches an --include pattern (all
when none is given) and no --exclude pattern. A pattern is a glob (* ? [a-z])
on the file's base name, or on its path relative to --src when it holds a /.
With --follow and no --exclude, the files a log rotation leaves beside a live
log are left out: numbered copies (app.log.1 … app.log.999), dated copies
(app.log-20261207, app.log-2026120713) and archives (*.gz *.bz2 *.xz *.zst
*.zip *.lz4); any --exclude replaces that list (--exclude '' leaves nothing
out). A followed file whose first bytes are not text (a compressed format,
NUL bytes) is refused, named in one warning. A followed file renamed away
(app.log to app.log.1) keeps its split and is read on. A followed file idle
for 5s parks: it keeps its split but frees its lane for a file that waits
for one (a renamed one is first read to its end), and is read on from where
it stopped if it grows again. New files are found at once where the system
reports them (inotify), else at the next listing. The split of a file that is
gone (deleted, or moved out of --src) is deleted from the store --retain (24h)
after it completed, so a job whose logs rotate for a year holds its live files
and that window.

Exit: 0 job complete (and verified); 1 error or failed verification; 3 job
stalled on quarantined splits (see spate inspect, spate requeue); 130/143
interrupted by SIGINT/SIGTERM after a graceful hand-back.`

func (f *backfillFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.src, "src", "", "source: a directory (links to regular files are followed), a bucket URL (file:///path, s3://bucket?region=…&prefix=…),\nor a table postgres://[user@]host[:port]/db?table=NAME[&key=COL&columns=A,B&where=EXPR&chunk_rows=N&password_file=FILE] (required)")
	fs.StringVar(&f.dst, "dst", "", "destination directory, bucket URL such as s3://bucket?region=…, or (from a table) a table postgres://…/db?table=NAME (required)")
	fs.StringVar(&f.job, "job", "", "job name (default: derived from the source)")
	fs.StringVar(&f.instance, "instance", "", "this worker's id, unique among live workers (default: host name and a random suffix); a stable id reclaims its splits at once after a crash")
	fs.IntVar(&f.lanes, "lanes", spate.DefaultMaxInFlight, "splits this worker holds at once")
	fs.IntVar(&f.threads, "threads", min(runtime.GOMAXPROCS(0), 4), "pipeline threads (at most 256)")
	fs.DurationVar(&f.lease, "lease", 15*time.Second, "split lease: how long a dead worker's splits wait before a peer takes them over (at least 300ms; whole seconds on etcd, at least 2s on the default store); the other timings derive from it")
	fs.IntVar(&f.maxAttempts, "max-attempts", spate.DefaultMaxAttempts, "delivery attempts (failures, or owner deaths without progress) after which a split is quarantined")
	fs.DurationVar(&f.commitInterval, "commit-interval", time.Second, "how often progress is committed (bounds what a takeover replays); at most --lease, which a shorter --lease lowers it to")
	fs.DurationVar(&f.drainTimeout, "drain-timeout", 15*time.Second, "how long a graceful stop may take to flush and commit")
	fs.DurationVar(&f.rebalanceDelay, "rebalance-delay", 0, "how long a departed worker's splits wait for it to come back (0: reassign at once)")
	fs.Int64Var(&f.splitBytes, "split-bytes", 64<<20, "target bytes per split (part of the job's identity)")
	fs.Int64Var(&f.rollSize, "roll-size", blobsink.DefaultRollSize, "bucket --dst: the staged bytes of a split that make an output part")
	fs.StringVar(&f.publish, "publish", "", "directory --dst: when a split's output file DST/<split>.out is published: complete (the default of a bounded job: it appears whole, renamed from its staging file, when the split completes; each byte is written once; not with --follow) or commit (the default with --follow: it grows at every commit; each byte is written twice, staged then copied)")
	fs.DurationVar(&f.rollInterval, "roll-interval", blobsink.DefaultRollInterval, "bucket --dst: a split's output becomes a part at most this long after it was read (latency against object count)")
	fs.IntVar(&f.splitFiles, "split-files", 16, "maximum files per split (part of the job's identity)")
	fs.IntVar(&f.minSplits, "min-splits", filesource.DefaultMinSplits, "the fewest splits the plan aims at, so that every worker of a fleet has work: the bytes per split are lowered to the input's bytes divided by this, not below 64 KiB, and a larger file is divided into line-aligned byte ranges (1: off; part of the job's identity)")
	fs.IntVar(&f.maxLineBytes, "max-line-bytes", filesource.DefaultMaxLineBytes, "the longest line read (bounds a lane's memory at about twice it); a longer line fails its split, naming the file and offset")
	fs.BoolVar(&f.follow, "follow", false, "a continuous job: new files are discovered every --discover and each file is followed as it grows (renames, truncations and deletions included); runs until SIGINT/SIGTERM, or --until-idle (part of the job's identity)")
	fs.DurationVar(&f.untilIdle, "until-idle", 0, "--follow: once no file was added, grown or shrunk for this long, the plan turns final and the job completes (0: run until stopped)")
	fs.DurationVar(&f.discover, "discover", 0, "--follow: how often the leader lists --src for new files besides the file-system events it watches (at least 100ms; 0: --lease)")
	fs.DurationVar(&f.retain, "retain", filesource.DefaultRetain, "--follow: a completed split whose file is gone (deleted, or moved out of --src) is deleted from the store this long after it completed (negative: kept forever)")
	fs.Var(&f.include, "include", "read only the files matching this glob, on the base name or (with a /) the path relative to --src; repeatable (default: every file)")
	fs.Var(&f.exclude, "exclude", "leave out the files matching this glob (as --include); repeatable; replaces --follow's default excludes of rotated copies and archives ('' leaves nothing out)")
	fs.Float64Var(&f.rate, "rate", 0, "write at most this many lines per second (0: unlimited)")
	fs.StringVar(&f.history, "history", "", "append a JSON-lines history of what this worker saw to this file")
	fs.BoolVar(&f.verify, "verify", true, "when the job completes, check that every input line is in --dst")
	fs.BoolVar(&f.quiet, "quiet", false, "print no event or progress lines, only results")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "serve Prometheus /metrics, /healthz and /readyz on this address")
}

func runBackfill(args []string) int {
	var f backfillFlags
	fs := newFlagSet("backfill", "--src DIR|URL --dst DIR|URL [flags]", backfillAbout)
	f.register(fs)
	f.store.register(fs)
	f.log.register(fs, "warn")
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if err := f.validate(fs, pos); err != nil {
		return usageError(fs, "%v", err)
	}
	return f.run(fs)
}

// deriveJob names a job after its source (an absolute directory, or a
// bucket URL's location): the base name and a hash of the whole.
func deriveJob(absSrc string) string {
	if isTableURL(absSrc) {
		return tableJob(absSrc)
	}
	sum := sha256.Sum256([]byte(absSrc))
	return sanitizeID(filepath.Base(absSrc), 40, "src") + "-" + hex.EncodeToString(sum[:4])
}

// sanitizeID keeps [A-Za-z0-9_-] (others become '-'), at most n bytes.
func sanitizeID(s string, n int, fallback string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	out := strings.Trim(string(b), "-")
	if len(out) > n {
		out = out[:n]
	}
	if out == "" {
		return fallback
	}
	return out
}

func defaultInstance() string {
	host, _ := os.Hostname()
	return sanitizeID(host, 40, "worker") + "-" + randomHex()[:8]
}

// within reports whether path is dir or inside it (both absolute, clean).
func within(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, dir+string(filepath.Separator))
}

// storeArgs are the flags that name this run's store, for the commands the
// run suggests.
func (f *backfillFlags) storeArgs(job string) string {
	var parts []string
	if f.store.url != "" {
		parts = append(parts, "--store "+redactStoreURL(f.store.url))
	} else {
		if f.store.dataDir != filepath.Join(".spate", "etcd") {
			parts = append(parts, "--data-dir "+f.store.dataDir)
		}
		if f.store.embedAddr != embedetcd.DefaultClientAddr {
			parts = append(parts, "--embed-addr "+f.store.embedAddr)
		}
	}
	parts = append(parts, "--job "+job)
	return strings.Join(parts, " ")
}

// jobSummary condenses a job's state.
type jobSummary struct {
	exists                            bool
	final                             bool
	planned                           uint64
	splits, completed, quarantined    int
	total, done                       int64
	members                           int
	fingerprint                       string
	quarantinedIDs                    []string
	quarantinedWhy                    map[string]string  // the reason recorded with each quarantined split
	damaged                           []spate.SplitState // out of play: a record cannot be read
	runnable                          int                // waiting for a worker: no live lease
	leased                            int                // held by a live worker's lease
	remaining                         int64              // bytes not yet committed, of the splits whose size is known
	leader                            string
	completedAll, stalled, consistent bool
	followed                          int   // followed files whose split is not complete
	lag                               int64 // bytes they held beyond their last commits
	// behind is the age of the oldest of those commits that left bytes
	// unread: the oldest unread byte is at least this old.
	behind time.Duration
}

func summarize(js *spate.JobState) jobSummary {
	s := jobSummary{exists: true, final: js.Plan.Finality == spate.PlanFinal, planned: js.Plan.Planned,
		splits: len(js.Splits), members: len(js.Members), fingerprint: js.Plan.Fingerprint}
	if js.Leader != nil {
		s.leader = js.Leader.Instance
	}
	for _, sp := range js.Splits {
		if sp.Progress != nil && sp.Status != spate.StatusCompleted {
			if lag, ok := filesource.TailLag(*sp.Progress); ok {
				s.followed++
				s.lag += lag
				if lag > 0 && !sp.WrittenAt.IsZero() {
					s.behind = max(s.behind, time.Since(sp.WrittenAt))
				}
			}
		}
		// A weight counts as is: the total is what the planner counted
		// (rows of a table, bytes of files), so an empty split adds
		// nothing to it (the assignment's "0 counts as 1" is for balance).
		w := int64(sp.Weight)
		if _, table := tablePlanKey(js.Plan.Fingerprint); table && sp.Status == spate.StatusCompleted && sp.Progress != nil {
			// A table's completed chunk counts the rows it copied: the
			// store records an empty chunk's weight 0 as 1.
			w = sp.Progress.Watermark
		}
		s.total += w
		switch {
		case sp.Damage != nil:
			s.damaged = append(s.damaged, sp)
			if sp.Progress != nil {
				s.done += min(sp.Progress.Watermark, w)
			}
		case sp.Status == spate.StatusCompleted:
			s.completed++
			s.done += w
		case sp.Status == spate.StatusQuarantined:
			s.quarantined++
			s.quarantinedIDs = append(s.quarantinedIDs, sp.ID.String())
			if s.quarantinedWhy == nil {
				s.quarantinedWhy = map[string]string{}
			}
			s.quarantinedWhy[sp.ID.String()] = sp.LastFailure
		default:
			if sp.LeaseOwner != "" {
				s.leased++
			} else {
				s.runnable++
			}
			if sp.Progress != nil {
				s.done += min(sp.Progress.Watermark, w)
			}
		}
		if r, ok := remainingBytes(sp); ok {
			s.remaining += r
		}
	}
	s.consistent = s.final && uint64(s.splits) >= s.planned
	s.completedAll = s.consistent && s.completed == s.splits
	s.stalled = s.consistent && s.runnable == 0 && s.leased == 0 && s.quarantined+len(s.damaged) > 0
	return s
}

// splitState is a split's state for people: its status, except that a
// runnable split under a live lease is "leased" (a worker holds it).
func splitState(sp spate.SplitState) string {
	if sp.Damage != nil {
		return string(spate.StatusDamaged)
	}
	if sp.Status == spate.StatusRunnable && sp.LeaseOwner != "" {
		return "leased"
	}
	return string(sp.Status)
}

// remainingBytes is what a split has left to commit (its lag): its size
// less its committed watermark. ok is false when its size is unknown (no
// spec).
func remainingBytes(sp spate.SplitState) (int64, bool) {
	if !sp.HasSpec && sp.Weight == 0 {
		return 0, false
	}
	if sp.Status == spate.StatusCompleted {
		return 0, true
	}
	var wm int64
	if sp.Progress != nil {
		wm = sp.Progress.Watermark
		if lag, ok := filesource.TailLag(*sp.Progress); ok {
			return lag, true // a followed file: what it held beyond the commit
		}
	}
	return max(int64(sp.Weight)-wm, 0), true
}

// readJob reads a job's state; exists is false when the store holds no plan.
func readJob(ctx context.Context, st spate.Store) (jobSummary, *spate.JobState, error) {
	js, err := spate.InspectJob(ctx, st, "")
	if err == nil {
		return summarize(js), js, nil
	}
	if errors.Is(err, spate.ErrNoJob) {
		// A new job (or one whose first worker is writing its plan right
		// now): this worker joins it like any other.
		return jobSummary{}, nil, nil
	}
	return jobSummary{}, nil, err
}

// run runs a backfill whose flags validated. Until the store is reached,
// nothing is created: the source, --dst and the store's settings are
// checked first.
func (f *backfillFlags) run(fs *flag.FlagSet) int {
	started := time.Now()
	con := newConsole(f.quiet)
	log, err := f.log.logger(con.logWriter())
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	// The input is listed with the job's logger: a special file it skips
	// is warned about in the job's log format.
	in, err := openInputLog(context.Background(), f.src, log)
	if err != nil {
		return usageError(fs, "--src %s: %v", argShown(f.src), err)
	}
	defer in.close()
	out, err := openOutput(context.Background(), f.dst)
	if err != nil {
		return usageError(fs, "--dst %s: %v", argShown(f.dst), err)
	}
	defer out.close()
	if why := f.endsOverlap(in, out); why != "" {
		return usageError(fs, "%s", why)
	}
	job, instance := f.job, f.instance
	if job == "" {
		job = deriveJob(in.location)
	}
	if instance == "" {
		instance = defaultInstance()
	}
	if out.table != nil {
		// The destination table is checked (its shape, the permission to
		// write, other jobs' fence rows) before anything starts.
		if err := out.openTable(context.Background(), job, in, f.lease); err != nil {
			return usageError(fs, "--dst %s: %v", argShown(f.dst), err)
		}
	}

	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	sigs := watchSignals(func(sig os.Signal) {
		con.line("received %v: stopping gracefully (handing splits back, flushing, committing); send it again to exit at once", sig)
		cancelRun()
	}, func(sig os.Signal) {
		con.line("received %v again: exiting now; held splits are taken over after their leases expire", sig)
	})
	defer sigs.stop()

	conn, st, code := f.openStore(runCtx, log, job)
	if st == nil {
		return code
	}
	defer conn.close()
	defer st.Close()
	// On the default store: the host names its worker; a worker that joined
	// records that it uses the store (its host stays up until it leaves) and
	// watches that the store is still there.
	conn.noteInstance(runCtx, instance)
	leave := conn.attend(runCtx, instance)
	watch := conn.watchStore(runCtx, log, f.lease, f.store.connectTimeout, f.restartCommand(conn, job, in.shownArg(), out.shownArg()), cancelRun)
	defer func() {
		if watch.err() == nil { // a store that is gone keeps nothing: its host prunes the record
			leave()
		}
	}()

	r := &backfillRun{f: f, con: con, log: log, conn: conn, st: st, job: job, instance: instance,
		in: in, out: out, sigs: sigs, started: started}
	if in.table != nil {
		r.plan = in.table.src // a table's source plans its chunks
	} else {
		popts := filesource.PlannerOptions{TargetBytes: f.splitBytes, MaxFiles: f.splitFiles, MinSplits: f.minSplits, Follow: f.follow, UntilIdle: f.untilIdle, Retain: f.retain,
			Include: f.include.patterns(), Exclude: f.exclude.patterns(), NoDefaultExcludes: f.exclude.set, Logger: log}
		if f.follow && f.discover > 0 && f.discover < f.lease {
			popts.Discover = f.discover // the planner lists on its own between the leader's replans
		}
		r.planner = filesource.NewPlanner(in.objs, popts)
		r.plan = r.planner
	}
	if code, done := r.announce(runCtx); done {
		return code
	}

	if f.history != "" {
		if r.hist, err = openHistory(f.history, instance); err != nil {
			return fail(exitFailed, "%v", err)
		}
		defer r.hist.close()
		r.hist.record("start", map[string]any{"job": job, "store": conn.describe, "src": in.location, "dst": out.location, "pid": os.Getpid(),
			"lease_ms": f.lease.Milliseconds(), "lanes": f.lanes})
	}

	w, code := r.build()
	if w == nil {
		return code
	}
	if code, ok := w.serve(f.metricsAddr, con, conn, st, job, log); !ok {
		return code
	}
	w.storeGone = watch.err
	code = r.runJob(runCtx, w)
	r.hist.record("exit", map[string]any{"code": code})

	if conn.hosted() {
		f.waitForOthers(con, conn, sigs)
	}
	return code
}

// endsOverlap says why --src and --dst (or the embedded store's
// --data-dir, or --history) may not be used together; "" when they may.
// Paths are compared as written and with their symbolic links resolved
// (a --dst reached through a link into --src is inside it).
func (f *backfillFlags) endsOverlap(in *input, out *destination) string {
	if in.table != nil && out.table != nil && in.location == out.location {
		return "--src and --dst name the same table (" + in.location + "): copy into another table"
	}
	if in.dir == "" {
		return ""
	}
	srcs := []string{in.dir, realPath(in.dir)}
	inSrc := func(p string) bool {
		for _, q := range []string{p, realPath(p)} {
			for _, s := range srcs {
				if within(q, s) {
					return true
				}
			}
		}
		return false
	}
	if out.dir != "" {
		if inSrc(out.dir) {
			return "--src and --dst must not contain each other (the output would become input)"
		}
		for _, d := range []string{out.dir, realPath(out.dir)} {
			for _, s := range srcs {
				if within(s, d) {
					return "--src and --dst must not contain each other (the output would become input)"
				}
			}
		}
	}
	if f.store.url == "" {
		if dd, err := filepath.Abs(f.store.dataDir); err == nil && inSrc(dd) {
			return fmt.Sprintf("--data-dir %s is inside --src: pass --data-dir elsewhere", f.store.dataDir)
		}
	}
	if f.history != "" {
		if h, err := filepath.Abs(f.history); err == nil && inSrc(h) {
			return fmt.Sprintf("--history %s is inside --src (the history would become input): pass --history elsewhere", f.history)
		}
	}
	return ""
}

// realPath is the absolute, clean path p with the symbolic links of its
// longest existing prefix resolved (the rest, not created yet, is
// appended as written): where p is, or will be once created.
func realPath(p string) string {
	p = filepath.Clean(p)
	var rest []string
	for dir := p; ; {
		if r, err := filepath.EvalSymlinks(dir); err == nil {
			return filepath.Join(append([]string{r}, rest...)...)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return p
		}
		rest = append([]string{filepath.Base(dir)}, rest...)
		dir = parent
	}
}

// openStore reaches the store and opens the job's keys in it, within
// --connect-timeout, refusing a --lease other than the job's recorded one.
// On failure the store is nil and the exit code says why.
func (f *backfillFlags) openStore(ctx context.Context, log *slog.Logger, job string) (*connector, spate.Store, int) {
	conn, err := f.store.connect(ctx, log, connectStart)
	if err != nil {
		return nil, nil, fail(exitFailed, "%v", err)
	}
	cctx, ccancel := context.WithTimeout(ctx, f.store.connectTimeout)
	defer ccancel()
	ttl, ok := conn.recordedTTL(cctx, job)
	if ok && ttl != f.lease {
		code := fail(exitUsage, "job %s was started with --lease %v on this store; pass the same --lease", job, ttl)
		conn.close()
		return nil, nil, code
	}
	st, err := conn.open(cctx, job, f.lease, f.store.connectTimeout)
	if err != nil {
		code := fail(exitFailed, "%v", conn.openError(err))
		conn.close()
		return nil, nil, code
	}
	return conn, st, exitOK
}

// backfillRun is what the phases of one run share once its store is
// reached: the flags, the console and logger, the store, the job and this
// worker, the input and output, the plan's shape, the signals and when it
// started.
type backfillRun struct {
	f             *backfillFlags
	con           *console
	log           *slog.Logger
	conn          *connector
	st            spate.Store
	job, instance string
	in            *input
	out           *destination
	planner       *filesource.Planner // nil for a table
	plan          spate.SplitPlanner  // the job's planner: planner, or a table's source
	hist          *history            // nil without --history
	sigs          *interrupts
	started       time.Time
}

// announce prints what this run finds of the job on the store: new,
// joined, resumed; and ends the run (done) for a job of another source,
// a complete job and a stalled one.
func (r *backfillRun) announce(ctx context.Context) (code int, done bool) {
	f, con, conn, st, job, instance, planner, out := r.f, r.con, r.conn, r.st, r.job, r.instance, r.plan, r.out
	src, dst := r.in.location, out.location
	before, _, err := readJob(ctx, st)
	if err != nil {
		return fail(exitFailed, "read job %s: %v", job, err), true
	}
	con.line("spate backfill: job %s, worker %s", job, instance)
	con.line("store: %s", conn.describe)
	if before.exists && before.fingerprint != planner.Fingerprint() {
		return fail(exitUsage, "job %s on this store belongs to another source or other split options:\n  the job:  %s\n  this run: %s\nuse another --job, or the job's own --src/--split-bytes/--split-files/--min-splits/--follow", job, before.fingerprint, planner.Fingerprint()), true
	}
	// The destination is bound to the plan that writes it before anything
	// is written to it.
	if _, err := f.bindJob(ctx, st, out, conn.describe, job, before, f.params(src, dst)); err != nil {
		var r *refusal
		if errors.As(err, &r) {
			return fail(exitUsage, "%s", r.msg), true
		}
		return fail(exitFailed, "%v", err), true
	}
	switch {
	case !before.exists:
		con.line("new job: %s -> %s", src, dst)
	case before.completedAll:
		con.line("job %s is already complete: all %d splits (%s) are committed completed; nothing to do", job, before.splits, r.in.amount(before.total))
		fmt.Fprintf(con.errOut, "spate backfill: job %s was already complete on this store; nothing was copied. To copy again from the start: spate delete %s, then spate backfill with an empty --dst\n",
			job, f.storeArgs(job))
		return exitOK, true
	case before.stalled:
		f.explainStalled(con, job, before, nil)
		return exitStalled, true
	case before.members > 0:
		con.line("joining running job: %d of %d splits completed, %d worker(s) running", before.completed, before.splits, before.members)
	default:
		con.line("resuming job: %d of %d splits completed (%s of %s committed)", before.completed, before.splits, r.in.amount(before.done), r.in.amount(before.total))
	}
	return exitOK, false
}

// backfillWorker is one run's coordinator, runtime and output, built
// before it runs.
type backfillWorker struct {
	coord    *spate.StoreCoordinator
	fileSink stagingSink
	rt       *pipeline.Runtime
	obs      *observer
	reg      *prometheus.Registry
	ms       *metricsServer
	jv       *jobViewMount
	lag      *followLag // --follow: the followed files' lag
	// storeGone is the loss of a default store another process hosted,
	// while it lasts.
	storeGone func() error
}

// build makes the worker: a coordinator over st, the coordinated file
// source, the staging sink to --dst (created here) and the runtime over
// them. On failure the worker is nil and the exit code says why.
func (r *backfillRun) build() (*backfillWorker, int) {
	f, con, log, hist, in, out, st, job, instance, planner := r.f, r.con, r.log, r.hist, r.in, r.out, r.st, r.job, r.instance, r.planner
	w := &backfillWorker{reg: newRegistry()}
	coord, err := spate.NewStoreCoordinator(st, f.config(instance), spate.WithLogger(log), spate.WithRegisterer(w.reg))
	if err != nil {
		return nil, fail(exitFailed, "%v", err)
	}
	w.coord = coord
	w.obs = newObserver(con, hist)
	w.obs.table = in.table != nil
	if f.follow {
		w.lag = newFollowLag(in.dir)
		w.reg.MustRegister(w.lag)
	}
	oc := &observedCoord{StoreCoordinator: coord, obs: w.obs}
	var splits pipeline.SplitSource
	if in.table != nil {
		// Into a table, a record carries a batch of rows, which the table's
		// sink copies as they are; into files, a row a record (a line).
		in.table.src.PackRows(out.table != nil)
		splits = &observedTable{Source: in.table.src, obs: w.obs}
	} else {
		splits = &observedSplits{Source: filesource.NewSource(in.objs).WithLogger(log).WithMaxLineBytes(f.maxLineBytes).WithPlanner(planner), obs: w.obs}
	}
	source := pipeline.NewCoordinatedSource(oc, splits, r.plan, pipeline.StallDrains(true), pipeline.DriverLogger(log))
	w.fileSink, err = out.sink(context.Background(), job, f.rollSize, f.rollInterval, f.publish == publishComplete) // creates --dst
	if err != nil {
		_ = coord.Close()
		return nil, fail(exitFailed, "%v", err)
	}
	sink := &outputSink{stagingSink: w.fileSink, obs: w.obs}
	pcfg := pipeline.Config{
		Name:           "backfill",
		Threads:        f.threads,
		CommitInterval: f.commitInterval,
		DrainTimeout:   f.drainTimeout,
		// A signal stops reading at once: unfinished splits are handed back
		// first, then the sinks flush and the final commit runs.
		StopReserve: f.drainTimeout,
		MinPause:    backfillMinPause,
	}
	sinkOpts := pipeline.SinkOptions{Shards: 2, QueueCapacity: backfillQueueChunks, Linger: backfillLinger}
	w.rt, err = pipeline.Build(pcfg, source, newPacer(f.rate).stages(),
		[]pipeline.SinkSpec{{Name: "file", Sink: sink, Options: sinkOpts}},
		pipeline.WithLogger(log), pipeline.WithRegisterer(w.reg))
	if err != nil {
		_ = coord.Close()
		return nil, fail(exitUsage, "%v", err)
	}
	return w, exitOK
}

// serve starts the metrics, health and job view endpoints on
// --metrics-addr, if it is set. On failure it closes the coordinator.
func (w *backfillWorker) serve(addr string, con *console, conn *connector, st spate.Store, job string, log *slog.Logger) (int, bool) {
	var mh http.Handler = w.rt.Handler(metricsHandler(w.reg))
	if addr != "" {
		var lag func() map[string]jobview.Lag
		if w.lag != nil {
			lag = w.lag.view
		}
		w.jv = mountJobView(mh, addr, job, st, conn.describe, log, lag)
		mh = w.jv
	}
	ms, err := serveMetrics(addr, mh)
	if err != nil {
		_ = w.coord.Close()
		return fail(exitFailed, "--metrics-addr: %v", err), false
	}
	w.ms = ms
	if ms != nil {
		con.line("metrics: http://%s/metrics (health: /healthz, /readyz; job view: /ui/)", ms.addr)
	}
	return exitOK, true
}

// runJob runs the worker until the job ends or a signal stops it, closes
// it, and reports the outcome.
func (r *backfillRun) runJob(ctx context.Context, w *backfillWorker) int {
	con, log, out, st := r.con, r.log, r.out, r.st
	stopProgress := r.f.progress(con, st, w.obs, w.lag, r.in, r.started)
	report, runErr := w.rt.Run(ctx)
	stopProgress()
	con.endStatus()
	// The job's final state is read before this worker leaves: a host of
	// the embedded store waits for the workers present, not for their
	// summaries.
	var final jobSummary
	if w.storeGone() == nil { // a store that is gone has nothing to tell
		fctx, fcancel := context.WithTimeout(context.Background(), 5*time.Second)
		final, _, _ = readJob(fctx, st)
		fcancel()
	}
	closeErr := w.coord.Close()
	_ = w.fileSink.Close()
	w.ms.stop()
	w.jv.close()

	end := runEnd{final: final, report: report, runErr: runErr, closeErr: closeErr}
	end.complete, end.stalled = w.obs.verdict()
	if err := w.storeGone(); err != nil && !end.complete && end.stalled == nil {
		// The store went away under this worker: that, not a graceful
		// stop, is how the run ended, whatever stopped it.
		end.runErr = err
	}
	if end.complete {
		// Staging files nobody lists (a frozen worker's, written after its
		// last commit) go once the job is complete.
		if err := out.removeStaging(context.Background()); err != nil {
			log.Warn("could not remove leftover staging files; they hold nothing committed", "dir", out.location, "error", err)
		}
	}
	end.sig = r.sigs.signal()
	return r.finish(w.obs, end)
}

// runEnd is how a run ended, for finish to report.
type runEnd struct {
	final    jobSummary // the job's state as the run ended (exists false when unread)
	complete bool
	stalled  *spate.Stalled
	sig      os.Signal // the signal that stopped the run, if one did
	report   pipeline.ExitReport
	runErr   error
	closeErr error
}

// The copy's pipeline tuning. Reading local files outruns writing and
// fsyncing them, so the sink queues fill up whenever an fsync is slow,
// and the runtime's defaults then cost far more than the fsync (issue
// 17): a runner that waits 10ms for room pauses for at least 500ms, long
// after the sink has caught up, and every batch waited 50ms for more
// chunks, which at the end of a split delays its completion and the next
// split's start. So a pause lasts at least 20ms (it still ends only once
// the queues are half empty), a shard's queue holds 64 chunks (4 MiB) to
// ride out an fsync, and a batch lingers 5ms (while a write is under way,
// the next batch takes in everything that arrives anyway).
const (
	backfillMinPause    = 20 * time.Millisecond
	backfillQueueChunks = 64
	backfillLinger      = 5 * time.Millisecond
)

// config is the coordinator's configuration: the timings derived from
// --lease, and the flags'.
func (f *backfillFlags) config(instance string) spate.Config {
	cfg := spate.TimingsForLease(f.lease)
	cfg.InstanceID = instance
	cfg.MaxAttempts = f.maxAttempts
	cfg.MaxInFlight = f.lanes
	cfg.RebalanceDelay = f.rebalanceDelay
	if cfg.RebalanceDelay <= 0 {
		cfg.RebalanceDelay = spate.NoRebalanceDelay
	}
	if f.follow {
		// A continuous job discovers new input at every replan.
		cfg.ReplanInterval = max(f.discover, f.lease)
	}
	return cfg
}

// finish prints the outcome and the summary, runs the verification and
// returns the exit code.
func (r *backfillRun) finish(obs *observer, end runEnd) int {
	f, con, job, in, out := r.f, r.con, r.job, r.in, r.out
	final, complete, stalled, sig, report, runErr, closeErr := end.final, end.complete, end.stalled, end.sig, end.report, end.runErr, end.closeErr
	dst := out.location
	elapsed := time.Since(r.started)
	code := exitOK
	var outcome string
	switch {
	case stalled != nil:
		outcome = "STALLED"
		code = exitStalled
	case complete && runErr == nil:
		outcome = "complete"
	case runErr != nil:
		outcome = "FAILED"
		code = exitFailed
	case sig != nil && f.follow:
		// A continuous job ends by a signal: its normal end.
		outcome = fmt.Sprintf("stopped (%v) after a graceful hand-back; the job goes on without this worker, and resumes where it was when spate backfill --follow runs again", sig)
	case sig != nil:
		outcome = fmt.Sprintf("interrupted (%v); the job goes on without this worker, or resumes when spate backfill runs again", sig)
		code = signalCode(sig)
	default:
		outcome = "stopped"
	}
	var verified verdict
	if code == exitOK && f.verify && !f.follow {
		var err error
		if in.table != nil {
			verified, err = verifyTable(context.Background(), in.table, out)
		} else {
			var r verifyResult
			r, err = verifyOutput(context.Background(), in.objs, out)
			verified = r
		}
		if err != nil {
			con.line("verification could not run: %v", err)
			code = exitFailed
			verified = nil
		}
	}
	recs, inBytes := obs.records.Load(), obs.bytes.Load()
	obs.mu.Lock()
	gained, resumed, lost, completedHere, handed := obs.gained, obs.resumed, obs.lost, obs.completed, obs.handedBack
	obs.mu.Unlock()
	con.plain("\nsummary: job %s %s\n", job, outcome)
	if final.exists {
		con.plain("  job        %d/%d splits completed, %d quarantined; %s of %s committed\n",
			final.completed, final.splits, final.quarantined, in.amount(final.done), in.amount(final.total))
	}
	con.plain("  splits     this worker gained %d (%d resumed from a commit), completed %d, lost %d, handed back %d\n",
		gained, resumed, completedHere, lost, handed)
	// What this worker staged; only what a won commit lists is published.
	con.plain("  records    %s %s (%s of input) read and staged by this worker; what the job committed is published under %s\n", count(recs), in.unit(), bytesStr(inBytes), dst)
	if verified != nil {
		con.plain("  duplicates %s\n", verified.duplicates(dst))
	} else if f.follow {
		con.plain("  duplicates not counted here: a followed input's files may have been renamed, truncated or deleted under the job; check with spate verify --expect FILE\n")
	} else {
		con.plain("  duplicates not counted (counted by the verification of a completed job; see spate verify)\n")
	}
	con.plain("  elapsed    %v: %s %s/s, %s/s\n", elapsed.Round(10*time.Millisecond),
		count(int64(rate(recs, elapsed))), in.unit(), bytesStr(int64(rate(inBytes, elapsed))))
	if verified != nil {
		con.plain("  %s\n", verified.report())
		if !verified.OK() {
			if out.table == nil {
				con.plain("  (workers on several hosts must all write to the job's --dst itself, on shared storage: each split's output is where its commits put it)\n")
			}
			code = exitFailed
		}
	}
	switch {
	case stalled != nil:
		f.explainStalled(con, job, final, obs.quarantinedSplits())
	case runErr != nil:
		con.plain("error: %v\n", runErr)
	}
	if report.UnresolvedAcks > 0 {
		con.plain("warning: %d acknowledgments were never resolved (a pipeline bug); their data replays on the next run\n", report.UnresolvedAcks)
	}
	if closeErr != nil && !errors.Is(closeErr, spate.ErrClosed) && runErr == nil {
		con.plain("warning: closing the coordinator: %v\n", closeErr)
	}
	return code
}

// explainStalled says why the job cannot finish: each quarantined split
// of the job (s) with its reason — this worker's own with the files they
// hold (detailed, "ID [files]: reason"), the others' with the reason the
// store recorded — and each damaged record with its fix.
func (f *backfillFlags) explainStalled(con *console, job string, s jobSummary, detailed []string) {
	args := f.storeArgs(job)
	ids, damaged := s.quarantinedIDs, s.damaged
	if len(ids) > 0 {
		mine := map[string]string{}
		for _, l := range detailed {
			id, _, _ := strings.Cut(l, " ")
			id, _, _ = strings.Cut(id, ":")
			mine[id] = l
		}
		con.plain("\nthe job cannot finish: %d split(s) are quarantined (their input, or their output under --dst, failed on every attempt; the reasons name the file and the fix):\n", len(ids))
		for _, id := range ids {
			switch why := s.quarantinedWhy[id]; {
			case mine[id] != "":
				con.plain("  %s\n", mine[id])
			case why != "":
				con.plain("  %s: %s\n", id, why)
			default:
				con.plain("  %s: (the store holds no reason; spate inspect shows the split)\n", id)
			}
		}
		if f.store.inProcess {
			// Nothing outlives this process on mem://: no command can
			// reach the job to inspect or requeue it.
			con.plain("the store (%s) held the job in this process only: its state, these splits included, is gone with it,\n"+
				"so spate inspect and spate requeue cannot reach it. Fix what the reasons name, then run the job again\n"+
				"into an empty --dst; on a store other processes reach (the default store, or --store etcd://, redis://,\n"+
				"nats://) a stalled job can be inspected and its splits requeued.\n", redactStoreURL(f.store.url))
		} else {
			con.plain("see them with:        spate inspect %s\n", args)
			con.plain("fix what the reason names, then:  spate requeue SPLIT %s\n", args)
		}
	}
	if len(damaged) > 0 {
		con.plain("\nthe job cannot finish: %d split(s) have a record the store holds but nobody can read:\n", len(damaged))
		for _, sp := range damaged {
			con.plain("  %s: %v\n    fix: %s\n", sp.ID, sp.Damage, sp.DamageFix)
		}
	}
	if !f.store.inProcess {
		con.plain("and run spate backfill again to finish the job.\n")
	}
}

// progress shows the job's progress until the returned stop is called: a
// bar on a terminal, a line every 5s otherwise. A followed job's lag is
// sampled every second (for /metrics), whatever the line's period.
func (f *backfillFlags) progress(con *console, st spate.Store, obs *observer, lag *followLag, in *input, started time.Time) (stop func()) {
	period := 5 * time.Second
	if con.tty {
		period = 500 * time.Millisecond
	}
	tick := period
	if lag != nil {
		tick = min(period, time.Second)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(tick)
		defer t.Stop()
		shown := time.Now()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			s, js, err := readJob(ctx, st)
			cancel()
			var files lagTotals
			if lag != nil {
				files = totalLag(lag.sample(js))
			}
			if now := time.Now(); now.Sub(shown) < period-tick/2 {
				continue
			} else {
				shown = now
			}
			recs := obs.records.Load()
			elapsed := time.Since(started)
			here := fmt.Sprintf("this worker: %s %s, %s %[2]s/s", count(recs), in.unit(), count(int64(rate(recs, elapsed))))
			if err != nil || !s.exists || s.total == 0 {
				con.setStatus("planning... " + here)
				continue
			}
			frac := float64(s.done) / float64(s.total)
			following := followingLine(s, files, here)
			if con.tty && f.follow {
				con.setStatus(fitWidth(following, con.columns()))
			} else if con.tty {
				con.setStatus(progressStatus(con.columns(), frac, s, here, in.amount))
			} else if !con.quiet && f.follow {
				con.event("%s", following)
			} else if !con.quiet {
				con.event("progress %.0f%%: %d/%d splits completed, %s of %s committed; %s", 100*frac,
					s.completed, s.splits, in.amount(s.done), in.amount(s.total), here)
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// waitForOthers keeps a hosted embedded store up while other workers use
// it, until they leave or a signal says to stop now. Twice a second it
// counts the processes that recorded that they use the store and still run
// (one that has not yet announced itself in its job, or is frozen past its
// lease, too) and the live workers of every job on the store. A count that
// fails is retried for two leases: leaving on one failure would strand the
// workers that still need the store.
func (f *backfillFlags) waitForOthers(con *console, conn *connector, sigs *interrupts) {
	sigs.hold.Store(true)
	stores := map[string]spate.Store{}
	defer func() {
		for _, st := range stores {
			_ = st.Close()
		}
	}()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	announced := ""
	var failingSince time.Time
	for {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		n, err := conn.liveWorkers(cctx, stores)
		var users []embedetcd.Attendee
		if err == nil {
			users, err = conn.local.Attendees(cctx)
		}
		ccancel()
		switch {
		case err != nil && failingSince.IsZero():
			failingSince = time.Now()
		case err != nil && time.Since(failingSince) >= 2*f.lease:
			con.line("stopping the embedded store: it could not tell for %v whether other workers still use it (%v)", 2*f.lease, err)
			return
		case err == nil && max(n, len(users)) == 0:
			return
		case err == nil:
			failingSince = time.Time{}
			names := make([]string, 0, len(users))
			for _, u := range users {
				names = append(names, u.String())
			}
			if msg := fmt.Sprintf("this process hosts the embedded store; %d other worker(s) still use it%s: keeping it up until they leave (Ctrl-C to stop it now)",
				max(n, len(users)), listed(names)); msg != announced {
				con.line("%s", msg)
				announced = msg
			}
		}
		select {
		case <-tick.C:
		case <-sigs.notify:
			con.line("stopping the embedded store now; the other workers say that it is gone, and exit unless it comes back (restart a worker on its --data-dir)")
			return
		}
	}
}

// listed renders names as " (a, b)", "" when there are none.
func listed(names []string) string {
	if len(names) == 0 {
		return ""
	}
	return " (" + strings.Join(names, ", ") + ")"
}

// behindStr renders how far behind a followed input is in time, "" when
// nothing is.
func behindStr(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return fmt.Sprintf(" (at least %v)", d.Round(time.Second))
}
