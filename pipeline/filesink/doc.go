// Package filesink holds the pipeline's file sinks, beside
// pipeline/blobsink (buckets) and pipeline/pgsink (a table):
//
//   - [FileSink] appends records to one file per shard and fsyncs before
//     it reports a write durable: at least once.
//   - [StagedFileSink] is a [pipeline.StagingSink]: each split's output is
//     staged beside the destination and published only after the commit
//     that lists it won, so wired to a [pipeline.CoordinatedSource] it
//     writes exactly once. PublishWhole publishes a completed split's file
//     by rename instead of by appended ranges.
//
// Both mark their disk faults (filefault.go): a fault that passes is
// retryable, a refusal no retry mends is fatal and names the path and
// the fix.
package filesink
