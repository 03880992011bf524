package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fixture writes a small root package: an actor with one owner struct
// (view, in view.go), written in its own file and from other.go.
func fixture(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.com/fix\n\ngo 1.26\n",
		"loop.go": `package fix

type actor struct {
	job   view
	dirty bool
}

func (a *actor) step() int { return a.job.n + len(a.job.seen) }
`,
		"view.go": `package fix

type view struct {
	n    int
	seen map[string]bool
}

func (v *view) bump() { v.n++ }
`,
		"other.go": `package fix

func (a *actor) note(k string) {
	a.job.seen[k] = true
	a.dirty = true
	_ = actor{job: view{n: 1}} // construction: neither a read nor a write
}

func long(a, b, c, d, e, f, g, h int) {}
`,
	}
	for name, src := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644))
	}
	return dir
}

func TestFieldsReadersAndWriters(t *testing.T) {
	r, err := loadRoot(fixture(t))
	require.NoError(t, err)
	fields, err := r.stateFields()
	require.NoError(t, err)
	r.countUses(fields)
	got := map[string][3][]string{}
	for _, f := range fields {
		got[f.path] = [3][]string{{f.owner, f.file}, keys(f.readers), keys(f.writers)}
	}
	assert.Equal(t, map[string][3][]string{
		"actor.job.n":    {{"view", "view.go"}, {"loop.go"}, {"view.go"}},
		"actor.job.seen": {{"view", "view.go"}, {"loop.go"}, {"other.go"}},
		"actor.dirty":    {{"actor", "loop.go"}, {}, {"other.go"}},
	}, got)
	for _, f := range fields {
		if f.path == "actor.job.seen" {
			assert.Equal(t, []string{"other.go"}, f.writtenOutside())
			assert.True(t, f.owned)
		}
	}
}

func TestLongParameterLists(t *testing.T) {
	long, err := longParams(fixture(t))
	require.NoError(t, err)
	assert.Equal(t, []string{"other.go:9 long(8)"}, long)
}
