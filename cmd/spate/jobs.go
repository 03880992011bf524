package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spate-go/spate"
)

const jobsAbout = `Lists the jobs on a store, one name per line, sorted: every job the store holds
keys of, whether it is being planned, running, finished or abandoned. With --long,
a table of each job's state (planning, running, complete, stalled; "no plan" when
the store holds keys of the job but no plan, "unreadable" when the job cannot be
opened), splits completed and live workers.`

func runJobs(args []string) int {
	fs := newFlagSet("jobs", "[--store URL] [--long]", jobsAbout)
	var sf storeFlags
	var lf logFlags
	long := fs.Bool("long", false, "show each job's state, splits and live workers")
	sf.register(fs)
	lf.register(fs, "warn")
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if err := checkFlags(
		func() error { return noPositional(pos) },
		func() error { _, err := sf.validate(); return err },
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
	ctx, cancel := context.WithTimeout(context.Background(), sf.connectTimeout)
	jobs, err := conn.dep.Jobs(ctx)
	timedOutNow := timedOut(ctx)
	cancel()
	if err != nil {
		if timedOutNow {
			err = conn.unreachable(sf.connectTimeout, err)
		}
		return fail(exitFailed, "list the jobs on %s: %v", conn.describe, err)
	}
	if len(jobs) == 0 {
		fmt.Fprintf(os.Stderr, "spate jobs: no jobs on %s\n", conn.describe)
		return exitOK
	}
	if !*long {
		for _, job := range jobs {
			fmt.Println(job)
		}
		return exitOK
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tSTATE\tSPLITS\tWORKERS")
	for _, job := range jobs {
		state, splits, workers := jobRow(conn, job, sf.connectTimeout)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", job, state, splits, workers)
	}
	_ = tw.Flush()
	return exitOK
}

// jobRow reads one job's state, splits completed and live workers for
// spate jobs --long; what cannot be read is "?" (and logged).
func jobRow(conn *connector, job string, timeout time.Duration) (state, splits, workers string) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	st, err := conn.open(ctx, job, conn.readTTL(ctx, job, 15*time.Second), timeout)
	if err != nil {
		conn.log.Warn("cannot open job", "job", job, "error", err)
		return "unreadable", "?", "?"
	}
	defer st.Close()
	state, splits, workers = "?", "?", "?"
	if ids, err := spate.LiveWorkers(ctx, st); err == nil {
		workers = fmt.Sprint(len(ids))
	}
	js, err := spate.InspectJob(ctx, st, "")
	switch {
	case errors.Is(err, spate.ErrNoJob):
		state = "no plan"
	case err != nil:
		conn.log.Warn("cannot read job", "job", job, "error", err)
		state = "unreadable"
	default:
		in := inspectionOf(job, conn.describe, js, nil)
		state = in.Summary.State
		splits = fmt.Sprintf("%d/%d", in.Summary.Completed, in.Summary.Splits)
	}
	return state, splits, workers
}

const deleteAbout = `Deletes every key of a job from its store: its plan, splits, progress, leases and
presence keys. A job with live workers is refused unless --force: they would lose
their leases and plan, and stop with an error (stop them first; a worker killed
without a graceful stop is live until its lease expires). Asks for confirmation on
stdin unless --yes. The job is named by --job, or derived from --src as backfill
derives it; delete never picks a job by itself.`

func runDelete(args []string) int {
	fs := newFlagSet("delete", "--job NAME [--force] [--yes] [--store URL]", deleteAbout)
	var c jobCommand
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	force := fs.Bool("force", false, "delete the job even while workers are running it")
	_, log, code, ok := c.parse(fs, args)
	if !ok {
		return code
	}
	sf, jf := &c.store, &c.job
	if jf.job == "" && jf.src == "" {
		return usageError(fs, "--job is required (or --src): delete never picks a job by itself (spate jobs lists them)")
	}
	conn, err := sf.connect(context.Background(), log, connectExisting)
	if err != nil {
		return fail(exitFailed, "%v", err)
	}
	defer conn.close()
	cctx, cancel := context.WithTimeout(context.Background(), sf.connectTimeout)
	defer cancel()
	job, err := resolveJob(cctx, conn, jf)
	if err != nil {
		if timedOut(cctx) {
			err = conn.unreachable(sf.connectTimeout, err)
		}
		return fail(exitFailed, "%v", err)
	}

	// Who is still running the job? Reading it needs a store over it.
	var workers []string
	st, err := conn.open(cctx, job, conn.readTTL(cctx, job, jf.lease), sf.connectTimeout)
	if err != nil {
		err = conn.openError(err)
	} else {
		workers, err = spate.LiveWorkers(cctx, st)
		_ = st.Close()
	}
	switch {
	case err != nil && !*force:
		return fail(exitFailed, "cannot check job %s for live workers: %v (pass --force to delete it anyway)", job, err)
	case err != nil:
		fmt.Printf("warning: cannot check job %s for live workers: %v\n", job, err)
	case len(workers) > 0 && !*force:
		return fail(exitFailed, "job %s has %d live worker(s): %s; stop them first (a killed worker is live until its lease expires), or pass --force",
			job, len(workers), strings.Join(workers, ", "))
	case len(workers) > 0:
		fmt.Printf("warning: job %s has %d live worker(s): %s; they lose their leases and plan and stop with an error\n",
			job, len(workers), strings.Join(workers, ", "))
	}
	if !*yes {
		if ok, code := confirm(fmt.Sprintf("delete job %s and every key of it from %s?", job, conn.describe), "deleted"); !ok {
			return code
		}
	}
	dctx, dcancel := context.WithTimeout(context.Background(), sf.connectTimeout+time.Minute)
	defer dcancel()
	if err := conn.dep.DeleteJob(dctx, job); err != nil {
		return fail(exitFailed, "delete job %s: %v", job, err)
	}
	fmt.Printf("deleted job %s from %s\n", job, conn.describe)
	return exitOK
}
