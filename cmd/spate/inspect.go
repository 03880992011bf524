package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline/filesource"
	"github.com/spate-go/spate/pipeline/pgsource"
	"github.com/spate-go/spate/storeurl"
)

// jobFlags pick a job on a store: --job, or the job backfill derives from
// --src, or the only job the store holds.
type jobFlags struct {
	job   string
	src   string
	lease time.Duration
}

func (j *jobFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&j.job, "job", "", "job name (default: derived from --src, or the store's only job)")
	fs.StringVar(&j.src, "src", "", "the job's source directory, bucket URL or postgres:// table URL (to derive the job name as backfill does)")
	fs.DurationVar(&j.lease, "lease", 15*time.Second, "the job's --lease (Redis records it with the job and refuses another; read from the store when it can be)")
}

// jobCommand is the opening the commands that reach one job on a store
// share (inspect, requeue, delete): the store, job and logging flags.
type jobCommand struct {
	store storeFlags
	job   jobFlags
	log   logFlags
}

// parse registers the shared flags on fs (the command registered its own
// first), parses args, checks the flags and makes the logger. The first
// len(lead) positional arguments are the command's own, lead[i] the
// error when the i-th is missing; no other may follow. pos holds the
// command's own. When ok is false the command exits with code.
func (c *jobCommand) parse(fs *flag.FlagSet, args []string, lead ...string) (pos []string, log *slog.Logger, code int, ok bool) {
	c.store.register(fs)
	c.job.register(fs)
	c.log.register(fs, "warn")
	pos, code, ok = parseArgs(fs, args)
	if !ok {
		return nil, nil, code, false
	}
	if len(pos) < len(lead) {
		return nil, nil, usageError(fs, "%s", lead[len(pos)]), false
	}
	if err := checkFlags(
		func() error { return noPositional(pos[len(lead):]) },
		func() error { _, err := c.store.validate(); return err },
		func() error {
			if c.job.job == "" {
				return nil
			}
			if err := validateJob(c.job.job); err != nil {
				return flagErrorf("--job: %v", err)
			}
			return nil
		},
		// The store's resolution does not apply: the lease is rounded to
		// it before the job is opened.
		func() error { return checkLease("lease", c.job.lease, storeurl.Info{}) },
		c.log.validate,
	); err != nil {
		return nil, nil, usageError(fs, "%v", err), false
	}
	log, err := c.log.logger(os.Stderr)
	if err != nil {
		return nil, nil, fail(exitUsage, "%v", err), false
	}
	return pos[:len(lead)], log, exitOK, true
}

// openJob connects, resolves the job and opens a store over it.
func openJob(ctx context.Context, sf *storeFlags, jf *jobFlags, log *slog.Logger) (*connector, spate.Store, string, error) {
	conn, err := sf.connect(ctx, log, connectExisting)
	if err != nil {
		return nil, nil, "", err
	}
	// Reaching the store takes at most --connect-timeout.
	cctx, cancel := context.WithTimeout(ctx, sf.connectTimeout)
	defer cancel()
	job, err := resolveJob(cctx, conn, jf)
	if err != nil {
		conn.close()
		if timedOut(cctx) {
			return nil, nil, "", conn.unreachable(sf.connectTimeout, err)
		}
		return nil, nil, "", err
	}
	st, err := conn.open(cctx, job, conn.readTTL(cctx, job, jf.lease), sf.connectTimeout)
	if err != nil {
		conn.close()
		return nil, nil, "", conn.openError(err)
	}
	return conn, st, job, nil
}

func resolveJob(ctx context.Context, conn *connector, jf *jobFlags) (string, error) {
	if err := conn.shared(); err != nil {
		return "", err
	}
	job := jf.job
	if job == "" && jf.src != "" {
		loc, err := inputLocation(jf.src)
		if err != nil {
			return "", err
		}
		job = deriveJob(loc)
	}
	if job != "" {
		if err := validateJob(job); err != nil {
			return "", err
		}
		ok, err := conn.dep.JobExists(ctx, job)
		if err != nil {
			return "", fmt.Errorf("look up job %s on %s: %w", job, conn.describe, err)
		}
		if !ok {
			return "", fmt.Errorf("no job %s on %s", job, conn.describe)
		}
		return job, nil
	}
	jobs, err := conn.dep.Jobs(ctx)
	if err != nil {
		return "", fmt.Errorf("list the jobs on %s: %w", conn.describe, err)
	}
	switch len(jobs) {
	case 0:
		return "", fmt.Errorf("no jobs on %s", conn.describe)
	case 1:
		return jobs[0], nil
	}
	return "", fmt.Errorf("%d jobs on %s; pass --job (or --src): %s", len(jobs), conn.describe, strings.Join(jobs, ", "))
}

// inspection is spate inspect's JSON output.
type inspection struct {
	Job         string              `json:"job"`
	Store       string              `json:"store"`
	Plan        planJSON            `json:"plan"`
	Leader      *leaderJSON         `json:"leader"`
	Members     []memberJSON        `json:"members"`
	Assignments map[string][]string `json:"assignments"`
	Summary     summaryJSON         `json:"summary"`
	Splits      []splitJSON         `json:"splits"`
}

type planJSON struct {
	Fingerprint string `json:"fingerprint"`
	Generation  uint64 `json:"generation"`
	Finality    string `json:"finality"`
	Planned     uint64 `json:"planned"`
}

type leaderJSON struct {
	Instance   string `json:"instance"`
	Generation uint64 `json:"generation"`
}

type memberJSON struct {
	Instance    string `json:"instance"`
	MaxInFlight int    `json:"max_in_flight"`
}

type summaryJSON struct {
	Splits      int `json:"splits"`
	Completed   int `json:"completed"`
	Leased      int `json:"leased"`           // held by a live worker
	Parked      int `json:"parked,omitempty"` // of the leased, idle followed files: they take no lane until they grow
	Runnable    int `json:"runnable"`         // waiting for a worker
	Quarantined int `json:"quarantined"`
	Damaged     int `json:"damaged"` // out of play: one of the split's records cannot be read
	// BytesTotal counts a split of unknown size as 1 byte.
	BytesTotal     int64 `json:"bytes_total"`
	BytesCommitted int64 `json:"bytes_committed"`
	// BytesRemaining is what is left to commit (the lag), over the splits
	// whose size is known.
	BytesRemaining int64 `json:"bytes_remaining"`
	// Followed counts the followed files (spate backfill --follow) whose
	// split is not complete; Lag is the bytes they held beyond their last
	// commits, as those commits recorded it.
	Followed int   `json:"followed,omitempty"`
	Lag      int64 `json:"lag,omitempty"`
	// Behind is the age of the oldest last commit that left a followed
	// file's bytes unread: the oldest unread byte is at least this old.
	Behind string `json:"behind,omitempty"`
	// Waiting counts the followed files that wait for a lane (no live
	// lease holds their split).
	Waiting int    `json:"waiting,omitempty"`
	State   string `json:"state"` // complete, stalled, running, following (an open plan), planning
	// Unit is what the bytes_ counts and the splits' weights and
	// watermarks count: "rows" for a table's job (they count rows then),
	// else absent (bytes).
	Unit string `json:"unit,omitempty"`
}

type splitJSON struct {
	ID     string `json:"id"`
	Status string `json:"status"` // the stored status: runnable, completed or quarantined
	// State is the status, or leased for a runnable split a live worker
	// holds, parked for one whose followed file is idle (held, it takes
	// no lane until the file grows).
	State string `json:"state"`
	// Remaining is the bytes left to commit (size less watermark; for a
	// followed file, what it held beyond the last commit); null when the
	// split's size is unknown.
	Remaining *int64 `json:"remaining"`
	// Behind, for a followed file with bytes left at its last commit, is
	// how long ago that commit was: the oldest unread byte is at least
	// this old.
	Behind string `json:"behind,omitempty"`
	// File, for a split that follows a file, is the file's path under
	// --src as it is now; Found is the name it was found under, when it
	// was renamed since. End says why a completed one completed.
	File  string `json:"file,omitempty"`
	Found string `json:"found,omitempty"`
	End   string `json:"end,omitempty"`
	// LagBytes and LagSeconds, for a followed file whose split is not
	// complete: the bytes it holds beyond its committed output (its size
	// now when --src is a directory here, else as the last commit saw
	// it), and the oldest unread byte's age, about (see docs).
	LagBytes   *int64  `json:"lag_bytes,omitempty"`
	LagSeconds float64 `json:"lag_seconds,omitempty"`
	Owner      string  `json:"owner"`
	Epoch      uint64  `json:"epoch"`
	Attempts   uint32  `json:"attempts"`
	Watermark  *int64  `json:"watermark"`
	Completed  bool    `json:"completed"`
	Weight     uint64  `json:"weight"`
	LeaseOwner string  `json:"lease_owner"`
	Revision   uint64  `json:"revision"`
	// LastFailure is why the split's last attempt was charged (a
	// quarantined split's is why it was set aside); empty if none was.
	LastFailure string `json:"last_failure,omitempty"`
	// Keys, for a split of a table's job, is its chunk's key range, as
	// "key <= 100", "key in (100, 200]" or "key > 200".
	Keys string `json:"keys,omitempty"`
	// Damage says which record cannot be read and why; DamageFix what to
	// do about it. Both empty unless the state is damaged.
	Damage    string `json:"damage,omitempty"`
	DamageFix string `json:"damage_fix,omitempty"`
}

// inspectionOf is the inspection of js; files is the lag of its followed
// files (a [filesource.LagMeter]'s measure of js), nil when not measured.
func inspectionOf(job, store string, js *spate.JobState, files []filesource.FileLag) inspection {
	s := summarize(js)
	lags := make(map[string]filesource.FileLag, len(files))
	for _, f := range files {
		lags[f.Split] = f
	}
	if len(files) > 0 {
		t := totalLag(files)
		s.followed, s.lag, s.behind = t.files, t.bytes, t.age
	}
	out := inspection{
		Job: job, Store: store,
		Plan:        planJSON{Fingerprint: js.Plan.Fingerprint, Generation: js.Plan.Generation, Finality: js.Plan.Finality.String(), Planned: js.Plan.Planned},
		Assignments: js.Assignments,
		Summary: summaryJSON{Splits: s.splits, Completed: s.completed, Leased: s.leased, Runnable: s.runnable,
			Quarantined: s.quarantined, Damaged: len(s.damaged), BytesTotal: s.total, BytesCommitted: s.done, BytesRemaining: s.remaining,
			Followed: s.followed, Lag: s.lag},
		Members: []memberJSON{},
		Splits:  []splitJSON{},
	}
	if s.behind > 0 {
		out.Summary.Behind = s.behind.Round(time.Second).String()
	}
	out.Summary.Waiting = totalLag(files).waiting
	switch {
	case s.completedAll:
		out.Summary.State = "complete"
	case s.stalled:
		out.Summary.State = "stalled"
	case !s.final && s.splits > 0:
		out.Summary.State = "following" // an open plan: a continuous job
	case !s.final:
		out.Summary.State = "planning"
	default:
		out.Summary.State = "running"
	}
	if js.Leader != nil {
		out.Leader = &leaderJSON{Instance: js.Leader.Instance, Generation: js.Leader.Generation}
	}
	for _, m := range js.Members {
		out.Members = append(out.Members, memberJSON{Instance: m.Instance, MaxInFlight: m.MaxInFlight})
	}
	tableKey, table := tablePlanKey(js.Plan.Fingerprint)
	if table {
		out.Summary.Unit = "rows"
	}
	for _, sp := range js.Splits {
		j := splitJSON{ID: sp.ID.String(), Status: string(sp.Status), State: splitState(sp), Owner: sp.Owner, Epoch: uint64(sp.Epoch),
			Attempts: sp.Attempts, Weight: sp.Weight, LeaseOwner: sp.LeaseOwner, Revision: sp.Revision, LastFailure: sp.LastFailure}
		if j.State == "leased" && sp.Progress != nil && sp.Progress.Parked {
			j.State = "parked"
			out.Summary.Parked++
		}
		if table && sp.HasSpec {
			if lo, hi, err := pgsource.KeyRange(spate.NewSplitSpec(sp.ID, sp.Descriptor)); err == nil {
				j.Keys = chunkRange{lo: lo, hi: hi}.keys(tableKey)
			}
		}
		if r, ok := remainingBytes(sp); ok {
			j.Remaining = &r
			if _, tail := filesource.TailLag(derefProgress(sp.Progress)); tail && r > 0 && !sp.WrittenAt.IsZero() {
				j.Behind = time.Since(sp.WrittenAt).Round(time.Second).String()
			}
		}
		if fl, ok := lags[j.ID]; ok {
			j.File, j.Remaining, j.LagBytes = fl.Name, &fl.Bytes, &fl.Bytes
			j.LagSeconds, j.Behind = fl.Age.Round(time.Second).Seconds(), ""
			if fl.Age > 0 {
				j.Behind = fl.Age.Round(time.Second).String()
			}
			if fl.Found != fl.Name {
				j.Found = fl.Found
			}
		} else if f, ok := filesource.FollowedOf(sp.Descriptor, sp.Progress); ok {
			j.File = f.Name
			if f.Found != f.Name {
				j.Found = f.Found
			}
			if sp.Status == spate.StatusCompleted {
				j.End = filesource.EndReason(f.End)
			}
		}
		if sp.Damage != nil {
			j.Damage, j.DamageFix = sp.Damage.Error(), sp.DamageFix
		}
		if sp.Progress != nil {
			w := sp.Progress.Watermark
			j.Watermark = &w
			j.Completed = sp.Progress.Completed
		}
		out.Splits = append(out.Splits, j)
	}
	return out
}

func runInspect(args []string) int {
	fs := newFlagSet("inspect", "[--store URL] [--job NAME] [--json]",
		"Shows a job's state as its store holds it, without joining the job: the plan (generation,\nfinality, planned), the live members and the leader, and every split's state (leased: a\nlive worker holds it; runnable: waiting for one; completed; quarantined), owner, epoch,\nattempts, committed watermark, remaining bytes and live lease. A table's job counts rows\ninstead of bytes and shows each split's key range.")
	var c jobCommand
	asJSON := fs.Bool("json", false, "print JSON (for scripts)")
	_, log, code, ok := c.parse(fs, args)
	if !ok {
		return code
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, st, job, err := openJob(ctx, &c.store, &c.job, log)
	if err != nil {
		return fail(exitFailed, "%v", err)
	}
	defer conn.close()
	defer st.Close()
	js, err := spate.InspectJob(ctx, st, "")
	if err != nil {
		return fail(exitFailed, "inspect job %s: %v", job, err)
	}
	in := inspectionOf(job, conn.describe, js, filesource.NewLagMeter(localDir(c.job.src)).Measure(js.Splits))
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(in); err != nil {
			return fail(exitFailed, "%v", err)
		}
		return exitOK
	}
	printInspection(os.Stdout, in)
	return exitOK
}

func printInspection(w io.Writer, in inspection) {
	fmt.Fprintf(w, "job       %s\n", in.Job)
	fmt.Fprintf(w, "store     %s\n", in.Store)
	fmt.Fprintf(w, "plan      generation %d, %s, %d splits planned\n", in.Plan.Generation, in.Plan.Finality, in.Plan.Planned)
	fmt.Fprintf(w, "          fingerprint %s\n", in.Plan.Fingerprint)
	if in.Leader != nil {
		fmt.Fprintf(w, "leader    %s (generation %d)\n", in.Leader.Instance, in.Leader.Generation)
	} else {
		fmt.Fprintf(w, "leader    none (no worker is running)\n")
	}
	var ms []string
	for _, m := range in.Members {
		ms = append(ms, fmt.Sprintf("%s (%d lanes, %d assigned)", m.Instance, m.MaxInFlight, len(in.Assignments[m.Instance])))
	}
	if len(ms) == 0 {
		ms = []string{"none"}
	}
	fmt.Fprintf(w, "members   %s\n", strings.Join(ms, ", "))
	s := in.Summary
	pct := 0.0
	if s.BytesTotal > 0 {
		pct = 100 * float64(s.BytesCommitted) / float64(s.BytesTotal)
	}
	leased := fmt.Sprintf("%d leased (running)", s.Leased)
	if s.Parked > 0 {
		leased = fmt.Sprintf("%d leased (%d running, %d parked: idle files, no lane)", s.Leased, s.Leased-s.Parked, s.Parked)
	}
	fmt.Fprintf(w, "state     %s: %d/%d splits completed, %s, %d runnable (waiting), %d quarantined",
		s.State, s.Completed, s.Splits, leased, s.Runnable, s.Quarantined)
	if s.Damaged > 0 {
		fmt.Fprintf(w, ", %d damaged", s.Damaged)
	}
	fmt.Fprintln(w)
	if s.Followed > 0 || s.State == "following" {
		behind := ""
		if s.Behind != "" {
			behind = " (oldest unread byte ~" + s.Behind + " old)"
		}
		waiting := ""
		if s.Waiting > 0 {
			waiting = fmt.Sprintf(" (%d waiting for a lane)", s.Waiting)
		}
		fmt.Fprintf(w, "follow    %d files followed%s, %s%s behind the input\n", s.Followed, waiting, bytesStr(s.Lag), behind)
	} else if s.Unit == "rows" {
		fmt.Fprintf(w, "rows      %s of %s committed (%.0f%%), %s remaining\n",
			count(s.BytesCommitted), count(s.BytesTotal), pct, count(s.BytesRemaining))
	} else {
		fmt.Fprintf(w, "bytes     %s of %s committed (%.0f%%), %s remaining\n",
			bytesStr(s.BytesCommitted), bytesStr(s.BytesTotal), pct, bytesStr(s.BytesRemaining))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	files := slices.ContainsFunc(in.Splits, func(sp splitJSON) bool { return sp.File != "" })
	keys := slices.ContainsFunc(in.Splits, func(sp splitJSON) bool { return sp.Keys != "" })
	head := "SPLIT\tSTATE\tOWNER\tEPOCH\tATTEMPTS\tWATERMARK\tREMAINING\tLEASE"
	if files {
		head += "\tFILE"
	}
	if keys {
		head += "\tKEYS"
	}
	fmt.Fprintln(tw, head)
	for _, sp := range in.Splits {
		wm := "-"
		if sp.Watermark != nil {
			wm = fmt.Sprintf("%d/%d", *sp.Watermark, sp.Weight)
		}
		rem := "?"
		switch {
		case sp.Remaining != nil && s.Unit == "rows":
			rem = count(*sp.Remaining) + " rows"
		case sp.Remaining != nil:
			rem = bytesStr(*sp.Remaining)
		}
		if sp.Behind != "" {
			rem += " (" + sp.Behind + " behind)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s", sp.ID, sp.State, dash(sp.Owner), sp.Epoch, sp.Attempts, wm, rem, dash(sp.LeaseOwner))
		if files {
			fmt.Fprintf(tw, "\t%s", fileName(sp.File, sp.Found))
		}
		if keys {
			fmt.Fprintf(tw, "\t%s", sp.Keys)
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
	if s.Quarantined > 0 {
		fmt.Fprintf(w, "\n%d split(s) quarantined: fix their input, then spate requeue SPLIT --job %s\n", s.Quarantined, in.Job)
		for _, sp := range in.Splits {
			if sp.Status == string(spate.StatusQuarantined) {
				fmt.Fprintf(w, "  %s after %d attempts: %s\n", sp.ID, sp.Attempts, orUnknown(sp.LastFailure))
			}
		}
	}
	if s.Damaged > 0 {
		fmt.Fprintf(w, "\n%d split(s) damaged: a record cannot be read, and the split is out of play until it is fixed\n", s.Damaged)
		for _, sp := range in.Splits {
			if sp.Damage != "" {
				fmt.Fprintf(w, "  %s: %s\n    fix: %s\n", sp.ID, sp.Damage, sp.DamageFix)
			}
		}
	}
}

// confirm asks question on stdout and reads the answer from stdin: ok only
// for y or yes. Otherwise it reports the refusal ("not <done>") and
// returns the exit code; an empty stdin says to pass --yes.
func confirm(question, done string) (ok bool, code int) {
	fmt.Printf("%s [y/N] ", question)
	answer, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return false, fail(exitFailed, "read the answer: %v", err)
	}
	a := strings.ToLower(strings.TrimSpace(answer))
	if slices.Contains([]string{"y", "yes"}, a) {
		return true, 0
	}
	if errors.Is(err, io.EOF) && a == "" {
		fmt.Println()
		return false, fail(exitFailed, "no answer on stdin: not %s (pass --yes to skip the prompt)", done)
	}
	fmt.Printf("not %s\n", done)
	return false, exitFailed
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func runRequeue(args []string) int {
	fs := newFlagSet("requeue", "SPLIT [--yes] [--store URL] [--job NAME]",
		"Puts a quarantined split back into play: status runnable, attempts reset, owner cleared\nand the epoch bumped, in one fenced compare-and-swap (a zombie of an earlier tenancy\nstays fenced). Running workers pick it up; otherwise run spate backfill again.")
	var c jobCommand
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	pos, log, code, ok := c.parse(fs, args, "SPLIT is required: the quarantined split to requeue (spate inspect lists them)")
	if !ok {
		return code
	}
	id, err := spate.NewSplitID(pos[0])
	if err != nil {
		return usageError(fs, "SPLIT %q: %s", pos[0], strings.TrimPrefix(err.Error(), "spate: "))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, st, job, err := openJob(ctx, &c.store, &c.job, log)
	if err != nil {
		return fail(exitFailed, "%v", err)
	}
	defer conn.close()
	defer st.Close()
	js, err := spate.InspectJob(ctx, st, "")
	if err != nil {
		return fail(exitFailed, "inspect job %s: %v", job, err)
	}
	sp, found := js.Split(id.String())
	if !found {
		var q []string
		for _, s := range js.Splits {
			if s.Status == spate.StatusQuarantined {
				q = append(q, s.ID.String())
			}
		}
		hint := "no split is quarantined"
		if len(q) > 0 {
			hint = "quarantined: " + strings.Join(q, ", ")
		}
		return fail(exitFailed, "job %s has no split %s (%s)", job, id, hint)
	}
	if sp.Status != spate.StatusQuarantined {
		return fail(exitFailed, "split %s of job %s is %s, not quarantined: nothing to requeue", id, job, sp.Status)
	}
	wm := "never committed"
	if sp.Progress != nil {
		wm = fmt.Sprintf("committed up to byte %d of %d", sp.Progress.Watermark, sp.Weight)
	}
	fmt.Printf("split %s of job %s: quarantined after %d attempts at epoch %d, %s\n", id, job, sp.Attempts, sp.Epoch, wm)
	fmt.Printf("  why: %s\n", orUnknown(sp.LastFailure))
	if !*yes {
		if ok, code := confirm(fmt.Sprintf("requeue it (runnable again, attempts reset, epoch %d)?", sp.Epoch+1), "requeued"); !ok {
			return code
		}
	}
	if err := spate.RequeueSplit(ctx, st, js.Plan.Fingerprint, id); err != nil {
		return fail(exitFailed, "requeue %s: %v", id, err)
	}
	after, err := spate.InspectJob(ctx, st, "")
	if err == nil {
		if s, ok := after.Split(id.String()); ok {
			fmt.Printf("requeued %s: %s at epoch %d, %d attempts\n", id, s.Status, s.Epoch, s.Attempts)
		}
	}
	if len(js.Members) > 0 {
		fmt.Printf("the %d running worker(s) of job %s pick it up\n", len(js.Members), job)
	} else {
		fmt.Printf("no worker of job %s is running: run spate backfill again to finish the job\n", job)
	}
	return exitOK
}

// orUnknown is a recorded failure reason, or what to say when a record of
// an earlier version carries none.
func orUnknown(reason string) string {
	if reason == "" {
		return "not recorded (a record written by an earlier version)"
	}
	return reason
}

// fileName names a followed file: where it is now, and where it was
// found when that differs.
func fileName(now, found string) string {
	switch {
	case now == "":
		return "-"
	case found != "" && found != now:
		return now + " (found as " + found + ")"
	}
	return now
}

// localDir is --src when it is a directory here (so the followed files'
// lag can be measured against their size now), else "".
func localDir(src string) string {
	if src == "" || strings.Contains(src, "://") {
		return ""
	}
	abs, err := filepath.Abs(src)
	if err != nil {
		return ""
	}
	if info, err := os.Stat(abs); err != nil || !info.IsDir() {
		return ""
	}
	return abs
}

func derefProgress(p *spate.SplitProgress) spate.SplitProgress {
	if p == nil {
		return spate.SplitProgress{}
	}
	return *p
}
