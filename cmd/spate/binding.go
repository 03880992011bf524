package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spate-go/spate"
)

// planParams is what spate backfill records of a job on its store, in the
// job's durable key paramsKey, when its first worker starts: the flags
// that shape the plan and its output, and the plan's identity. Every later
// worker is checked against it (a worker writing to another --dst would
// take over splits whose output is elsewhere), and the destination is
// bound to Plan (see destBinding).
type planParams struct {
	V          int    `json:"v"`
	Plan       string `json:"plan"` // random: this job on this store
	Src        string `json:"src"`
	Dst        string `json:"dst"`
	SplitBytes int64  `json:"split_bytes"`
	SplitFiles int    `json:"split_files"`
	Follow     bool   `json:"follow"`
}

// paramsKey is the durable key of a job's planParams: outside the
// coordinator's key layout, which ignores it; spate delete removes it with
// the job's other keys.
const paramsKey = "backfill.params"

// params are this worker's planParams (Plan left empty). --until-idle is
// not one of them: a followed job is resumed with it to wind it down.
func (f *backfillFlags) params(src, dst string) planParams {
	return planParams{V: 1, Src: src, Dst: dst, SplitBytes: f.splitBytes, SplitFiles: f.splitFiles, Follow: f.follow}
}

// differences lists the flags of mine that differ from the job's p, each
// with both values.
func (p planParams) differences(mine planParams) []string {
	var d []string
	add := func(flag, job, this string) {
		if job != this {
			d = append(d, fmt.Sprintf("%-14s the job's %s, this worker's %s", flag, job, this))
		}
	}
	add("--src", p.Src, mine.Src)
	add("--dst", p.Dst, mine.Dst)
	add("--follow", fmt.Sprint(p.Follow), fmt.Sprint(mine.Follow))
	if !p.Follow && !mine.Follow { // a followed file is a split of its own
		add("--split-bytes", fmt.Sprint(p.SplitBytes), fmt.Sprint(mine.SplitBytes))
		add("--split-files", fmt.Sprint(p.SplitFiles), fmt.Sprint(mine.SplitFiles))
	}
	return d
}

// readParams reads the job's planParams; ok is false when it has none (a
// new job, or one started by an earlier version).
func readParams(ctx context.Context, st spate.Store) (p planParams, ok bool, err error) {
	e, ok, err := st.Get(ctx, spate.Durable, paramsKey)
	if err != nil || !ok {
		return p, false, err
	}
	if err := json.Unmarshal(e.Value, &p); err != nil || p.Plan == "" {
		return p, false, fmt.Errorf("the job's key %s is not a record spate backfill wrote (%v): delete the job (spate delete) and its output, and run again", paramsKey, err)
	}
	return p, true, nil
}

// bindJobBetweenReads, when set (by tests), runs between bindJob's read
// of the destination's binding and its read of the job's parameters.
var bindJobBetweenReads func()

// refusal is why a worker may not run: exit 2 with msg.
type refusal struct{ msg string }

func (r *refusal) Error() string { return r.msg }

// bindJob checks this worker against the job's recorded parameters and
// its --dst against the plan that wrote it, then records both where they
// are missing: the job's parameters on the store (with a new plan
// identity, for the job's first worker) and the destination's binding.
// before is the job as announce read it. A *refusal error is a worker
// that may not run.
func (f *backfillFlags) bindJob(ctx context.Context, st spate.Store, out *destination, storeDesc, job string, before jobSummary, mine planParams) (planParams, error) {
	// The binding is read before the job's parameters: a worker writes
	// them in the other order (parameters, then binding), so a binding
	// seen here whose plan the store lacks is truly another plan's, never
	// a fellow first worker's that recorded both between our two reads.
	// A table has no binding file: the fence table binds it to its job
	// (pgsink refuses a table that holds another job's fence rows).
	var dst destBinding
	var bound bool
	var err error
	if out.table == nil {
		if dst, bound, err = out.readBinding(ctx); err != nil {
			return planParams{}, err
		}
	}
	if bindJobBetweenReads != nil {
		bindJobBetweenReads()
	}
	rec, ok, err := readParams(ctx, st)
	if err != nil {
		return rec, err
	}
	if !ok {
		if out.table == nil {
			if err := f.checkNewPlan(ctx, out, job, storeDesc, before, dst, bound); err != nil {
				return rec, err
			}
		}
		mine.Plan = randomHex()[:16]
		data, err := json.Marshal(mine)
		if err != nil {
			return rec, err
		}
		o, err := st.Create(ctx, spate.Durable, paramsKey, data)
		if err != nil {
			return rec, fmt.Errorf("record job %s's parameters: %w", job, err)
		}
		if o.Won {
			rec = mine
		} else if rec, ok, err = readParams(ctx, st); err != nil || !ok { // another worker recorded them first
			if err == nil {
				err = fmt.Errorf("job %s's key %s vanished as it was written", job, paramsKey)
			}
			return rec, err
		}
	}
	if d := rec.differences(mine); len(d) > 0 {
		return rec, &refusal{fmt.Sprintf("this worker's flags differ from those of job %s on this store:\n  %s\n"+
			"every worker of a job reads the same input, planned the same way, and writes the same destination: pass the job's flags, or use another --job",
			job, strings.Join(d, "\n  "))}
	}
	if out.table != nil {
		return rec, nil
	}
	if bound {
		if dst.Plan != rec.Plan {
			return rec, f.otherPlan(out, job, storeDesc, dst, fmt.Sprintf("its job %s is another plan (%s)", job, rec.Plan))
		}
		return rec, nil
	}
	if before.done > 0 {
		// The job committed output, and every worker writes the binding
		// before its first line: this --dst is not where it went.
		if marked, err := out.markedJob(ctx); err != nil || marked != job {
			return rec, &refusal{fmt.Sprintf("job %s has committed output under its --dst %s, but %s holds none of it (no %s):\n"+
				"every worker must write to the job's destination itself (on shared storage, for workers on several hosts); pass it as --dst.\n"+
				"to copy everything anew instead: spate delete %s, then run spate backfill again",
				job, rec.Dst, out.location, out.metaName(bindingKey), f.storeArgs(job))}
		}
	}
	dst, err = out.bind(ctx, destBinding{V: 1, Job: job, Plan: rec.Plan, Store: storeDesc, Src: rec.Src, At: time.Now().UTC().Format(time.RFC3339)})
	if err != nil {
		return rec, err
	}
	if dst.Plan != rec.Plan { // a worker of another plan bound it first
		return rec, f.otherPlan(out, job, storeDesc, dst, fmt.Sprintf("its job %s is another plan (%s)", job, rec.Plan))
	}
	return rec, nil
}

// checkNewPlan refuses to start a plan (the job's first worker on this
// store) over a destination another plan wrote: bound to a plan, or, from
// an earlier version, holding published output with no binding.
func (f *backfillFlags) checkNewPlan(ctx context.Context, out *destination, job, storeDesc string, before jobSummary, dst destBinding, bound bool) error {
	what := fmt.Sprintf("it holds no record of job %s", job)
	if before.exists {
		what = fmt.Sprintf("its job %s was started by an earlier version of spate and is not bound to this destination", job)
	}
	if bound {
		return f.otherPlan(out, job, storeDesc, dst, what)
	}
	if before.exists {
		return nil // an earlier version's job, resumed: its destination is bound now
	}
	// An earlier version's output: its job marker, and published files.
	// (Files under no marker are no job's: the sink refuses each one that
	// a split would publish to.)
	marked, err := out.markedJob(ctx)
	if err != nil || marked == "" {
		return err
	}
	if has, err := out.hasOutput(ctx); err != nil || !has {
		return err
	}
	return &refusal{fmt.Sprintf("--dst %s holds published output (%s) of job %s, and no binding (%s) ties it to a plan,\n"+
		"but this store (%s) holds no record of job %s: a new plan would copy again what the destination already holds.\n"+
		"fix: run with the store that holds that job; or give this run an empty --dst (or empty %s first) to copy everything anew",
		out.location, filepath.Join(out.location, "*"+outputSuffix), marked, out.metaName(bindingKey), storeDesc, job, out.location)}
}

// otherPlan is the refusal of a destination bound to another plan than
// this store's job: what each one is, and the fix.
func (f *backfillFlags) otherPlan(out *destination, job, storeDesc string, dst destBinding, here string) error {
	return &refusal{fmt.Sprintf("--dst %s holds the output of job %s, plan %s (of --src %s; bound %s on %s; see %s),\n"+
		"but this store (%s) does not hold that plan: %s.\n"+
		"a new plan would copy again what the destination already holds.\n"+
		"fix: run with the store that holds plan %s (the same --store, or the same --data-dir for the default store); "+
		"or give this run an empty --dst (or empty %s first) to copy everything anew",
		out.location, dst.Job, dst.Plan, dst.Src, dst.At, dst.Store, out.metaName(bindingKey), storeDesc, here, dst.Plan, out.location)}
}
