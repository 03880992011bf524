package filesource_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline/filesource"
)

// TailLag is what the last commit of a followed file recorded: the bytes
// the file held past the watermark, counted from the split offset of the
// file's byte 0 after a truncation. Progress that is not a followed
// file's has no lag.
func TestTailLag(t *testing.T) {
	state := func(base, size int64) []byte {
		b, err := json.Marshal(map[string]int64{"base": base, "size": size})
		require.NoError(t, err)
		return b
	}
	cases := []struct {
		name      string
		p         spate.SplitProgress
		lag       int64
		ok        bool
		rationale string
	}{
		{"bounded split", spate.SplitProgress{Watermark: 40}, 0, false, "no tail state: not a followed file"},
		{"behind", spate.SplitProgress{Watermark: 40, State: state(0, 100)}, 60, true, "100 bytes held, 40 committed"},
		{"caught up", spate.SplitProgress{Watermark: 100, State: state(0, 100)}, 0, true, ""},
		{"after a truncation", spate.SplitProgress{Watermark: 110, State: state(100, 30)}, 20, true,
			"the file restarted at split offset 100: 10 of its 30 bytes committed"},
		{"past the recorded size", spate.SplitProgress{Watermark: 130, State: state(0, 100)}, 0, true, "lag never goes negative"},
		{"corrupt state", spate.SplitProgress{Watermark: 1, State: []byte("{")}, 0, false, "an unreadable state is no lag, not a guess"},
		{"negative base", spate.SplitProgress{Watermark: 1, State: state(-1, 5)}, 0, false, "a base before the file is corrupt"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lag, ok := filesource.TailLag(c.p)
			assert.Equal(t, c.ok, ok, c.rationale)
			assert.Equal(t, c.lag, lag, c.rationale)
		})
	}
}

// A followed file's split id is its identity's: a rename keeps it, a new
// file (another inode, or the same inode born again) gets another. Its
// spec's descriptor names the file where the planner found it, and its
// weight is the file's size, at least 1.
func TestTailSplitFollowsTheFileNotItsName(t *testing.T) {
	id := filesource.FileID{Dev: 1, Ino: 42, Birth: 1000}
	assert.Equal(t, filesource.TailSplitID(id), filesource.TailSplitID(id), "deterministic")
	assert.NotEqual(t, filesource.TailSplitID(id), filesource.TailSplitID(filesource.FileID{Dev: 1, Ino: 43, Birth: 1000}))
	assert.NotEqual(t, filesource.TailSplitID(id), filesource.TailSplitID(filesource.FileID{Dev: 1, Ino: 42, Birth: 2000}),
		"a reused inode is another file")

	a, err := filesource.TailSplitFor(filesource.Member{Name: "logs/app.log", Size: 500}, id)
	require.NoError(t, err)
	b, err := filesource.TailSplitFor(filesource.Member{Name: "logs/app.log.1", Size: 0}, id)
	require.NoError(t, err)
	assert.Equal(t, filesource.TailSplitID(id), a.ID)
	assert.Equal(t, a.ID, b.ID, "renamed, the file keeps its split")
	assert.Equal(t, uint64(500), a.Weight)
	assert.Equal(t, uint64(1), b.Weight, "an empty file still weighs 1")

	d, err := filesource.DecodeDescriptor(a.Descriptor)
	require.NoError(t, err)
	require.NotNil(t, d.Tail)
	assert.Empty(t, d.Files, "a tail split has no bounded members")
	assert.Equal(t, "logs/app.log", d.Tail.Name)
	assert.Equal(t, id, d.Tail.FileID)
}
