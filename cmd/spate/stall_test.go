package main

import (
	"bytes"
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A stall on mem:// does not suggest spate inspect or spate requeue: the
// store lived in the process, which is ending, so no command can reach the
// job. It says so, and what works. On a store other processes reach, it
// suggests both, with the flags that name the store.
func TestStallSummarySuggestsWhatWorks(t *testing.T) {
	summary := func(url string) string {
		t.Helper()
		f := &backfillFlags{store: storeFlags{url: url}}
		c, err := f.store.connect(context.Background(), slog.New(slog.DiscardHandler), connectStart)
		require.NoError(t, err)
		c.close()
		var out bytes.Buffer
		f.explainStalled(&console{out: &out, errOut: &out}, "j", jobSummary{quarantinedIDs: []string{"s1"}}, []string{"s1 after 3 attempts: f.txt: no such file"})
		return out.String()
	}
	mem := summary("mem://")
	assert.Contains(t, mem, "s1 after 3 attempts: f.txt: no such file", "the stall summary lost the reason")
	for _, cmd := range []string{"spate inspect --", "spate requeue SPLIT", "run spate backfill again to finish the job"} {
		assert.NotContains(t, mem, cmd, "a stall on mem:// suggests what cannot work:\n%s", mem)
	}
	assert.Contains(t, mem, "is gone with it", "a stall on mem:// does not say the job's state ended with the process:\n%s", mem)
	assert.Contains(t, mem, "run the job again\ninto an empty --dst", "a stall on mem:// does not say what to do:\n%s", mem)

	shared := summary("redis://127.0.0.1:1")
	assert.Contains(t, shared, "spate inspect --store redis://127.0.0.1:1 --job j")
	assert.Contains(t, shared, "spate requeue SPLIT --store redis://127.0.0.1:1 --job j")
}
