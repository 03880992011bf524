package main

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder is a testify TestingT that keeps what it was told.
type recorder struct{ logs []string }

func (r *recorder) Errorf(format string, args ...any) {
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

// The rule table shows a testify failure as the rule it states and what
// was seen, not as a source trace and a diff.
func TestLogLinesCondensesTestifyFailures(t *testing.T) {
	var r recorder
	assert.Equal(&r, "v2", "v1", "rule: Get reads the latest write; %s after write %d", "durable", 1)
	assert.True(&r, false, "rule: a deleted key reads absent")
	require.Len(t, r.logs, 2)
	assert.Equal(t, []string{"rule: Get reads the latest write; durable after write 1", "  Not equal:", `  expected: "v2"`, `  actual  : "v1"`},
		logLines(r.logs[0]))
	assert.Equal(t, []string{"rule: a deleted key reads absent", "  Should be true"}, logLines(r.logs[1]))
	assert.Equal(t, []string{"harness: open store: refused", "second line"}, logLines("harness: open store: refused\nsecond line\n"))
}
