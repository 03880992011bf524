package pipeline

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/spate-go/spate"
)

// StagingSink is a [Sink] whose output becomes visible only through the
// split's fenced commit: exactly-once output. It is the two-phase sink
// contract.
//
//  1. Write stages: it puts a tenancy's records where no reader looks
//     (a staging file, an upload nobody completed). A nil return means
//     staged, not yet durable.
//  2. At a commit the [CoordinationDriver] calls Prepare, which makes the
//     staged bytes of the records below the watermark durable and returns
//     a small committable listing them. The committable rides in the
//     split's progress record ([spate.SplitProgress.Output]) by the same
//     compare-and-swap as the watermark.
//  3. Only after that compare-and-swap won does the coordination driver
//     call Publish, which makes what the committable lists visible,
//     idempotently.
//  4. A new owner's OpenStage first finishes what the committed record
//     lists (idempotently: a zombie or a crashed owner may have published
//     some or all of it), then discards staged output the record does not
//     list.
//
// A process frozen past its lease (a zombie) can still stage, but its
// commits are fenced, so nothing it stages is ever listed, and it can
// never change a published byte: what it may still hold open is never
// published by rename or truncation (see pipeline/filesink).
//
// [Build] wires a staging sink to a [CoordinatedSource] by itself; at most
// one sink of a pipeline stages (one committable per commit). A sink that
// cannot stage (a plain [Sink]) is at-least-once: a takeover replays the
// uncommitted tail into it.
//
// The coordination driver calls OpenStage and CloseStage from the controller
// goroutine. It commits several splits at once, so Prepare and Publish of
// different partitions may run concurrently with each other; one partition's
// calls never overlap and keep their order. Write runs on the shard writers
// concurrently with all of them.
type StagingSink interface {
	Sink
	// OpenStage begins a tenancy of a split. committed is the Output of the
	// split's committed progress (nil before its first commit). An error
	// marked [spate.ErrRetryable] (a passing fault of the destination) or
	// the call's deadline has the stage tried again, backing off, with no
	// attempt spent; any other error sets the split aside (the
	// coordination driver reports it as poison with the error as the
	// reason), so it must name the damaged file or object and the fix.
	OpenStage(ctx context.Context, t StageTenancy, committed []byte) error
	// Prepare makes durable what the tenancy staged for its records with an
	// offset below watermark, and returns the committable listing that and
	// everything listed before and not yet published. covered is the
	// watermark the committable covers: watermark itself, or, for a sink
	// that rolls its output in parts (an object store), the watermark of the
	// last part it cut, when the bytes staged since are too few or too
	// recent to make a part of their own; the coordination driver then
	// commits covered. With final set (the split completes, or is handed
	// back) covered must be watermark. pending reports that the committable
	// lists something unpublished. An error marked [spate.ErrFatal] stops
	// the pipeline; any other defers the commit to the next one.
	Prepare(ctx context.Context, partition PartitionID, watermark int64, final bool) (committable []byte, covered int64, pending bool, err error)
	// Publish makes visible what committable (from Prepare) lists. It is
	// called once the commit that carried committable won, and again if
	// it failed; it must be idempotent.
	Publish(ctx context.Context, partition PartitionID, committable []byte) error
	// CloseStage ends the tenancy. completed reports the split's
	// completion committed (with nothing left to publish): its staging
	// area can go. Staged output of a tenancy closed otherwise stays for
	// the next owner to finish or discard.
	CloseStage(partition PartitionID, completed bool)
}

// StageTenancy names one tenancy of a split for a [StagingSink].
type StageTenancy struct {
	Split     spate.SplitID
	Epoch     spate.LeaseEpoch
	Partition PartitionID
}

// ErrNoStage is returned by a staging sink's Write for a record whose
// partition has no open stage: the sink was not wired to the coordinated
// source (see [Build]).
var ErrNoStage = errors.New("no open stage for the record's partition: a staging sink must be wired to a coordinated source (pipeline.Build does it; with pipeline.New, call CoordinatedSource.StageOutput)")

// stagingWirer is implemented by sources that carry a staging sink's
// committable in their commits ([CoordinatedSource]).
type stagingWirer interface {
	StageOutput(StagingSink) error
}

// wireStaging finds the staging sink among sinks and hands it to src.
func wireStaging(src Source, sinks []SinkSpec) error {
	var staging []string
	var found StagingSink
	for _, s := range sinks {
		if ss, ok := s.Sink.(StagingSink); ok {
			staging = append(staging, s.Name)
			found = ss
		}
	}
	switch {
	case len(staging) == 0:
		return nil
	case len(staging) > 1:
		return fmt.Errorf("pipeline: sinks %v all stage, but a commit carries one committable: make at most one of them a staging sink", staging)
	}
	w, ok := src.(stagingWirer)
	if !ok {
		return fmt.Errorf("pipeline: sink %q stages its output (exactly-once), which needs a coordinated source to carry its committable; this source (%T) cannot", staging[0], src)
	}
	return w.StageOutput(found)
}

// Stage retries: an OpenStage that failed transiently is tried again
// after stageRetryMin, doubling up to stageRetryMax.
const (
	stageRetryMin = 100 * time.Millisecond
	stageRetryMax = 5 * time.Second
)

// TransientStageError reports whether the coordination driver treats an
// error of [StagingSink.OpenStage] as a fault that passes (marked
// [spate.ErrRetryable], or the call's deadline) and opens the stage again
// later, rather than as damage or a refusal that no retry can mend, which
// sets the split aside with the error as its reason. A sink's tests use
// it to check how the coordination driver will read the sink's errors.
func TransientStageError(err error) bool {
	if errors.Is(err, ErrOutputDamaged) || isFatal(err) && !errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	return spate.IsRetryable(err) || errors.Is(err, context.DeadlineExceeded)
}

// stagedDue reports whether a staged tenancy waits for its lane and not
// for the retry of its stage.
func (d *CoordinationDriver[C]) stagedDue(now time.Time) bool {
	for _, t := range d.staged {
		if !now.Before(t.stageRetryAt) {
			return true
		}
	}
	return false
}

// nextStageRetry is when the earliest stage retry falls due.
func (d *CoordinationDriver[C]) nextStageRetry() (time.Time, bool) {
	var due time.Time
	for _, t := range d.staged {
		if t.stageRetryAt.IsZero() {
			continue
		}
		if due.IsZero() || t.stageRetryAt.Before(due) {
			due = t.stageRetryAt
		}
	}
	return due, !due.IsZero()
}

// openStages opens the staging sink's stage of every staged tenancy whose
// turn it is. A tenancy whose stage cannot open because of damage (its
// committed output no longer matches) or a refusal (the destination holds
// what no commit lists) is set aside: the split is failed with the sink's
// error as the reason, which costs an attempt and, past the limit,
// quarantines it, while the other splits go on. A transient fault (a
// bucket or disk error marked Retryable, a timeout) costs no attempt: the
// tenancy keeps its lease and its stage is tried again, backing off.
func (d *CoordinationDriver[C]) openStages() error {
	if d.stage == nil {
		return nil
	}
	now := time.Now()
	kept := d.staged[:0]
	for _, t := range d.staged {
		if t.stageOpen || now.Before(t.stageRetryAt) {
			kept = append(kept, t)
			continue
		}
		var committed []byte
		if t.progress != nil {
			committed = t.progress.Output
		}
		ctx, cancel := d.ctx()
		err := d.stage.OpenStage(ctx, StageTenancy{Split: t.spec.ID, Epoch: t.epoch, Partition: t.partition}, committed)
		cancel()
		if err == nil {
			t.stageOpen = true
			t.stageFails, t.stageRetryAt = 0, time.Time{}
			kept = append(kept, t)
			continue
		}
		if TransientStageError(err) {
			t.stageFails++
			wait := min(stageRetryMin<<min(t.stageFails-1, 16), stageRetryMax)
			t.stageRetryAt = time.Now().Add(wait)
			d.opts.log.Warn("the split's output cannot be staged yet; retrying (no attempt is spent)", "split", t.spec.ID, "failures", t.stageFails, "retry_in", wait, "error", err)
			kept = append(kept, t)
			continue
		}
		reason := fmt.Sprintf("output: %v", err)
		d.opts.log.Error("the split's output cannot be staged; setting the split aside", "split", t.spec.ID, "error", err)
		ctx, cancel = d.ctx()
		ferr := d.coord.Fail(ctx, t.spec.ID, reason)
		cancel()
		if ferr != nil && !errors.Is(ferr, spate.ErrFenced) {
			d.refused = append(d.refused, poisonReport{split: t.spec.ID, reason: reason})
		}
		t.state = tenancyRetired
		delete(d.held, t.spec.ID)
		delete(d.byPartition, t.partition)
	}
	clear(d.staged[len(kept):])
	d.staged = kept
	return nil
}

// closeStages closes the open stages of ts.
func (d *CoordinationDriver[C]) closeStages(ts []*tenancy) {
	for _, t := range ts {
		if d.stage != nil && t.stageOpen {
			d.stage.CloseStage(t.partition, t.completed)
			t.stageOpen = false
		}
	}
}

// prepare asks the staging sink for the committable of t at watermark,
// and the watermark it covers.
func (d *CoordinationDriver[C]) prepare(t *tenancy, watermark int64, final bool) ([]byte, int64, bool, error) {
	ctx, cancel := d.ctx()
	defer cancel()
	out, covered, pending, err := d.stage.Prepare(ctx, t.partition, watermark, final)
	if err != nil {
		return nil, 0, false, fmt.Errorf("prepare the output of split %s: %w", t.spec.ID, err)
	}
	if covered > watermark || final && covered != watermark {
		return nil, 0, false, spate.Fatalf("prepare the output of split %s: the sink covered watermark %d of %d (final %t): a staging sink covers at most the watermark, and all of it when final", t.spec.ID, covered, watermark, final)
	}
	return out, covered, pending, nil
}

// publishNoSpaceAttempts bounds the publishes of one committable that
// fail with "no space left on device": past it the pipeline fails, naming
// the destination, instead of retrying while the disk stays full.
const publishNoSpaceAttempts = 5

// publish publishes a won commit's committable; a failure keeps it for a
// retry on the next poll (the committed record lists it, so a new owner
// would publish it too). Only a destination that stays full is an error.
func (d *CoordinationDriver[C]) publish(t *tenancy, committable []byte) error {
	if t.outputDamaged {
		t.unpublished = committable
		return nil // set aside: failed on the next poll
	}
	ctx, cancel := d.ctx()
	err := d.stage.Publish(ctx, t.partition, committable)
	cancel()
	if err == nil {
		t.unpublished, t.noSpace = nil, 0
		return nil
	}
	t.unpublished = committable
	if errors.Is(err, ErrOutputDamaged) {
		// No retry can mend it, and no later commit of the split can be
		// published: the split is failed (an attempt; the next owner's
		// stage finds the damage too, and past the limit the split is
		// quarantined with this reason), the rest of the job goes on.
		t.outputDamaged = true
		d.opts.log.Error("the split's published output was damaged under the job; setting the split aside", "split", t.spec.ID, "error", err)
		d.ReportPoison(t.spec.ID, fmt.Sprintf("output: %v", err))
		return nil
	}
	if errors.Is(err, spate.ErrFatal) && !errors.Is(err, context.DeadlineExceeded) {
		// A destination that refuses for good (permission denied, a
		// read-only filesystem: the sink's fix is in err): set aside as
		// damage is, not retried forever.
		t.outputDamaged = true
		d.opts.log.Error("the split's output cannot be published; setting the split aside", "split", t.spec.ID, "error", err)
		d.ReportPoison(t.spec.ID, fmt.Sprintf("output: %v", err))
		return nil
	}
	if errors.Is(err, syscall.ENOSPC) {
		if t.noSpace++; t.noSpace >= publishNoSpaceAttempts {
			return spate.Fatalf("publishing the output of split %s failed %d times: %v; free space on the destination and run again (what is committed resumes, nothing is lost)", t.spec.ID, t.noSpace, err)
		}
	}
	d.opts.log.Warn("publishing committed output failed; it is retried (a new owner publishes it too)", "split", t.spec.ID, "error", err)
	return nil
}

// finishCompletion commits a completion that waited for its output to be
// published, once it is.
func (d *CoordinationDriver[C]) finishCompletion(src SplitSource, t *tenancy) error {
	c := t.completing
	if c == nil || t.unpublished != nil {
		return nil
	}
	t.completing = nil
	err := d.commitTenancy(src, t, *c)
	if err != nil && isFatal(err) {
		return err
	}
	if !t.completed && t.state != tenancyRetired && t.completing == nil {
		t.completing = c // the completion did not land: retried on the next poll
	}
	return err
}
