package pipeline

import "context"

// StageCleaner is implemented by a [StagingSink] that leaves something
// behind once a job is over: staging a zombie wrote after its last
// commit, bookkeeping such as a database sink's fence rows. Leftovers of
// a lost tenancy are the next owner's to discard in OpenStage (step 4 of
// the [StagingSink] contract); what no owner will ever open again is
// CleanJob's.
//
// The coordination driver calls CleanJob once, from the controller
// goroutine, when it learns the job completed (every split's completion
// committed), before it reports the input drained; every worker of the
// fleet does, so it must be idempotent. An error is logged and the job
// still completes: nothing committed depends on the clean-up.
type StageCleaner interface {
	CleanJob(ctx context.Context) error
}

// cleanStages runs the staging sink's CleanJob once the job completed.
func (d *CoordinationDriver[C]) cleanStages() {
	if d.stagesCleaned || d.stage == nil {
		return
	}
	d.stagesCleaned = true
	c, ok := d.stage.(StageCleaner)
	if !ok {
		return
	}
	ctx, cancel := d.ctx()
	defer cancel()
	if err := c.CleanJob(ctx); err != nil {
		d.opts.log.Warn("the job completed, but the staging sink's clean-up failed; what it left is harmless and can be removed by hand", "error", err)
	}
}
