// Package pipeline is the runtime that runs a data pipeline on top of
// spate's coordination: it polls a source's lanes, pushes the records
// through a transform chain into sinks, and commits a source watermark only
// behind what the sinks made durable.
//
// # Goroutines
//
// [Runtime.Run] starts one controller goroutine, Config.Threads lane
// runner goroutines and one writer goroutine per sink shard. The controller is the
// only caller of [Source] methods: it applies assignment changes, harvests
// acknowledgments on every pass, commits on the commit tick (and faster for
// partitions whose lanes reached end of input), applies the runners'
// pause and resume requests, and runs the drain. Each runner owns its lanes
// and its chain; it serves control messages before every lane poll, so a
// stopped lane is never polled again. Control, event and acknowledgment
// queues are unbounded and never block their sender: a poll loop never
// waits on a channel send.
//
// # Acknowledgments
//
// Every polled batch carries one [AckRef]. Go has no destructors, so
// references are counted explicitly: whoever keeps a batch's data past the
// push holds a reference ([AckRef.Clone], or an ack set) and gives it back exactly
// once. Dropping a record on purpose (a filter, a Skip policy) is delivery;
// every path that loses data (a failed chain, an abandoned blocked batch, a
// torn-down queue, a sink that gave up) fails the reference before it
// releases it. When the last reference goes, one resolution reaches the
// [Checkpointer]. A reference that is never released stalls its partition
// (never a loss) and is counted in [ExitReport.UnresolvedAcks].
//
// # Checkpointing
//
// The checkpointer tracks each partition's batches in the current
// assignment epoch and advances its watermark only over a gap-free prefix
// of delivered batches. A failed batch stalls its partition for good:
// nothing behind it commits, and past Config.StalledFailAfter the pipeline
// fails (a restart replays it). Acknowledgments from an earlier epoch or a
// revoked partition are discarded. A partition's pending batches are capped
// by Config.MaxPendingBatches: a lane at its ceiling is not polled until the
// watermark advances. The bytes read past a partition's last commit that
// landed are capped by Config.MaxUncommittedBytes, and while the source's
// commits are not landing (failed or deferred) a lane with anything
// uncommitted is not polled at all until a commit lands: what it would read
// could not be committed, and all of it replays if the leases run out.
//
// # Backpressure
//
// Chain terminals offer sealed chunks to bounded per-shard sink queues
// without blocking; a full queue parks the chunk and blocks the chain. The
// runner then polls no lane: it waits for the queue to take the parked
// chunk and pushes on the moment it does. A queue that stays full past
// Config.BlockGrace (or the in-flight byte budget reaching its high mark)
// is backpressure: the runner asks the source to pause its lanes, and
// resumes once the budget is below its low mark, every queue is below its
// low fill, and the pause lasted Config.MinPause.
//
// # Stopping
//
// Cancelling Run's context, or [Runtime.Stop], is a graceful stop. While
// the source says it is still reading ([Source.ReadingOnStop]) the
// controller runs on, committing, until Config.StopReserve before the drain
// deadline (Config.DrainTimeout after the trigger). Then the source stops
// taking on work ([Source.StopReading]), the runners flush and drop their
// lanes, the sink queues close and drain until the deadline (what is not
// written by then is abandoned and replays), the final commit runs, and the
// source gets Config.CloseShare to close — a coordinated source hands its
// splits back only then, after the final commit. A source whose input is
// drained (a bounded job done) ends the run the same way; its Completed exit
// then means every record was acknowledged and committed, else the run fails.
//
// # Delivery
//
// At least once through a plain [Sink]: a watermark never passes data that
// is unacknowledged or failed, across revocations, failures and shutdown;
// anything written but not committed replays after a restart or under a
// new owner. Exactly once through a [StagingSink] (filesink.StagedFileSink, or
// pipeline/blobsink for buckets) wired to a [CoordinatedSource]: its
// committable rides in the split's fenced commit, so only output a won
// commit lists is ever published. In steady state nothing replays either
// way: a revocation drains (see [SplitSource.BeginRevoke]).
//
// # Coordinated sources
//
// [CoordinationDriver] adapts a [spate.SplitCoordinator] to the source
// contract for a [SplitSource]: each split tenancy is one lane on a fresh
// partition, commits go through the coordinator's fenced commit, and
// revocations drain: the coordination driver stops polling the revoked
// split's lane between two batches, commits what it emitted once
// acknowledged, and hands the split back. [CoordinatedSource] packages the
// whole source.
//
// Writing your own: a planner ([spate.SplitPlanner]: Fingerprint, Plan), a
// [SplitSource] (OpenSplit, EncodeCommit, Sweep, CloseSplit; embed
// [BaseSplitSource] for the rest) and a [Lane] that reads its split from
// the resume watermark and reports end of input (Sweep's completion) once
// it has emitted everything. A source whose lanes can read on through a
// graceful stop implements [StopReader]. examples/rangescan is such a
// source in about 135 lines (a range scan of ids over a table-like input,
// exactly once through a StagedFileSink); the filesource subpackage is a
// complete one over a directory of files.
//
// # Observability
//
// [WithRegisterer] registers the Prometheus series (spate_pipeline_*,
// spate_checkpoint_*, spate_source_*, spate_backpressure_*, spate_queue_*,
// spate_sink_*, spate_transform_*); [Runtime.Handler] serves /healthz and
// /readyz. Logs go to a [log/slog] logger ([WithLogger]).
package pipeline
