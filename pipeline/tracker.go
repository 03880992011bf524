package pipeline

import (
	"fmt"
	"time"
)

type slotState uint8

const (
	slotPending slotState = iota
	slotDelivered
	slotFailed
)

type slot struct {
	last  int64
	state slotState
}

type resolveOutcome uint8

const (
	resolveApplied resolveOutcome = iota
	// resolveDuplicate: the slot was already resolved.
	resolveDuplicate
	// resolveAlreadyAdvanced: the seq is below the head.
	resolveAlreadyAdvanced
	// resolveUnregistered: the seq is beyond every registration so far;
	// retry after draining registrations.
	resolveUnregistered
)

// partitionTracker follows one partition's batches within one epoch and
// yields the watermark over the gap-free prefix of delivered batches.
type partitionTracker struct {
	buf     []slot // buf[start:] holds seqs headSeq, headSeq+1, ...
	start   int
	headSeq uint64
	nextSeq uint64

	stalled      bool
	stalledSince time.Time
	stalledSeq   uint64
}

func (t *partitionTracker) register(seq uint64, last int64) error {
	if seq != t.nextSeq {
		return fmt.Errorf("batch registration gap: got seq %d, expected %d (two issuers on one partition in one epoch?)", seq, t.nextSeq)
	}
	t.buf = append(t.buf, slot{last: last})
	t.nextSeq++
	return nil
}

func (t *partitionTracker) resolve(seq uint64, status ackStatus) resolveOutcome {
	if seq < t.headSeq {
		return resolveAlreadyAdvanced
	}
	if seq >= t.nextSeq {
		return resolveUnregistered
	}
	s := &t.buf[t.start+int(seq-t.headSeq)]
	if s.state != slotPending {
		return resolveDuplicate
	}
	if status == ackDelivered {
		s.state = slotDelivered
	} else {
		s.state = slotFailed
	}
	return resolveApplied
}

// advance pops the contiguous delivered prefix. It returns the new
// committable offset (last offset + 1 of the last popped batch) and how many
// batches it retired. A failed batch at the head stalls the tracker for
// good: nothing behind it ever commits.
func (t *partitionTracker) advance(now time.Time) (offset int64, retired uint64, moved bool) {
	for t.start < len(t.buf) {
		s := t.buf[t.start]
		if s.state == slotFailed {
			if !t.stalled {
				t.stalled = true
				t.stalledSince = now
				t.stalledSeq = t.headSeq
			}
			break
		}
		if s.state != slotDelivered {
			break
		}
		offset, moved = s.last+1, true
		retired++
		t.start++
		t.headSeq++
	}
	if t.start == len(t.buf) {
		t.buf, t.start = t.buf[:0], 0
	} else if t.start > 64 && t.start > len(t.buf)/2 {
		n := copy(t.buf, t.buf[t.start:])
		t.buf, t.start = t.buf[:n], 0
	}
	return offset, retired, moved
}

// pending is the number of batches registered and not yet advanced past.
func (t *partitionTracker) pending() int { return len(t.buf) - t.start }
