package pipeline

import "fmt"

// PartitionID is the unit of checkpointing, chosen by the source: watermarks,
// trackers, pending gates and commits are all keyed by partition. A
// coordinated source mints a fresh one for every split tenancy and never
// reuses it.
type PartitionID uint32

// LaneID is the unit of polling: one pollable data-plane object owned by
// exactly one runner goroutine. It is stable until the lane is revoked or
// retired. Several lanes may share a partition. A lane id is never reused
// in the source's lifetime.
type LaneID uint32

// batchID identifies one polled batch: its partition, the assignment epoch
// it was issued in, and its sequence number, contiguous from 0 per
// (issuer, partition, epoch).
type batchID struct {
	Partition PartitionID
	Epoch     uint32
	Seq       uint64
}

func (b batchID) String() string {
	return fmt.Sprintf("p%d/e%d/s%d", b.Partition, b.Epoch, b.Seq)
}

// Watermark is a committable position of one partition: one past the last
// acknowledged record's offset.
type Watermark struct {
	Partition PartitionID
	Offset    int64
}

// ackStatus is how a batch resolved.
type ackStatus uint8

const (
	// ackDelivered: every record derived from the batch is durable (or was
	// deliberately dropped: filtered, skipped by policy).
	ackDelivered ackStatus = iota
	// ackFailed: some record derived from the batch was not made durable. The
	// watermark never advances past a failed batch.
	ackFailed
)

func (s ackStatus) String() string {
	if s == ackDelivered {
		return "delivered"
	}
	return "failed"
}
