package pipeline

import (
	"context"
	"sync"
)

// CaptureSink keeps every written record in memory, for tests. Fail, when
// set, decides each write's outcome before anything is kept.
type CaptureSink struct {
	mu      sync.Mutex
	records []Record
	writes  int
	// Fail returns the error a write fails with (nil: the write lands).
	Fail func(shard int, records []Record) error
}

// Write implements [Sink].
func (c *CaptureSink) Write(ctx context.Context, shard int, records []Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes++
	if c.Fail != nil {
		if err := c.Fail(shard, records); err != nil {
			return err
		}
	}
	for _, r := range records {
		r.Key = append([]byte(nil), r.Key...)
		r.Value = append([]byte(nil), r.Value...)
		c.records = append(c.records, r)
	}
	return nil
}

// Records returns a copy of everything written.
func (c *CaptureSink) Records() []Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Record(nil), c.records...)
}

// Len is the number of records written.
func (c *CaptureSink) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.records)
}

// Writes is the number of Write calls.
func (c *CaptureSink) Writes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writes
}
