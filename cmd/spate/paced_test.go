package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// --rate caps a worker whatever its lanes, and the coordinator is told so
// (spate.Config.Paced): the division trigger then counts the worker free
// only while it holds no split.
func TestBackfillRateMakesTheWorkerPaced(t *testing.T) {
	f := backfillFlags{lease: 4 * time.Second, maxAttempts: 3, lanes: 5}
	assert.False(t, f.config("w-1").Paced, "no --rate")
	f.rate = 10000
	assert.True(t, f.config("w-1").Paced, "--rate 10000")
}
