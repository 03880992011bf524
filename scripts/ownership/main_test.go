package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fixture is a small root package (testdata/fix): an actor with a view
// (jobView, view.go) and a tenancy (tenancy.go), a handle, a commit entry
// whose path runs view → a pure decoder → tenancy → back to the view →
// the handle, and a function with 8 parameters.
const fixture = "testdata/fix"

func load(t *testing.T) (*root, []*field) {
	t.Helper()
	r, err := loadRoot(fixture)
	require.NoError(t, err)
	fields, err := r.stateFields()
	require.NoError(t, err)
	r.countUses(fields)
	return r, fields
}

func TestFieldsReadersAndWriters(t *testing.T) {
	_, fields := load(t)
	got := map[string][3][]string{}
	for _, f := range fields {
		got[f.path] = [3][]string{{f.owner, f.file}, keys(f.readers), keys(f.writers)}
	}
	assert.Equal(t, map[string][3][]string{
		"actor.c":         {{"actor", "loop.go"}, {"tenancy.go"}, {}},
		"actor.job.n":     {{"jobView", "view.go"}, {"loop.go"}, {"view.go"}},
		"actor.job.seen":  {{"jobView", "view.go"}, {"loop.go"}, {"other.go", "view.go"}},
		"actor.ten.owned": {{"tenancy", "tenancy.go"}, {"tenancy.go"}, {"tenancy.go"}},
		"actor.dirty":     {{"actor", "loop.go"}, {}, {"other.go"}},
	}, got)
	for _, f := range fields {
		if f.path == "actor.job.seen" {
			assert.Equal(t, []string{"other.go"}, f.writtenOutside())
			assert.True(t, f.owned)
		}
	}
}

func TestSummaryMeasures(t *testing.T) {
	r, fields := load(t)
	var tb table
	r.summarizeFields(fields, &tb)
	g := r.callGraph()
	r.summarizeView(fields, g, &tb)
	require.NoError(t, r.summarizeCommitPath(fields, g, "actor.committed", &tb))
	// seen is used from loop.go, view.go and other.go.
	assert.Equal(t, [2]int{1, 5}, [2]int{tb.wide, tb.leaves}, "fields used from 3 files")
	// Owned: job.n, job.seen, ten.owned; seen is written in other.go.
	assert.Equal(t, [3]int{1, 3, 0}, [3]int{tb.outside, tb.owned, tb.outsideDirty}, "owned fields written outside")
	assert.Equal(t, [2]int{2, 4}, [2]int{tb.jobViewFields, tb.jobFiles}, "jobView fields, files using a.job")
	// upsert calls holds (a getter) and drop (writes the tenancy): one
	// reaction; bump is the view's own.
	assert.Equal(t, [2]int{1, 1}, [2]int{tb.viewCalls, tb.viewCallees}, "view's reactions")
	// Every call: committed (commit.go) → upsert (view.go) → decode
	// (records.go; → check, same file), holds, drop (tenancy.go) → bump
	// (back to view.go: a climb), emit (coordinator.go).
	assert.Equal(t, [3]int{5, 6, 1}, [3]int{tb.allFiles, tb.allMoves, tb.allClimbs}, "commit path, every call")
	// The state handlers: decode and check select no state (pure
	// helpers), nor does the handle's emit; committed, the entry, is
	// always on the path. commit.go → view.go → tenancy.go → view.go.
	assert.Equal(t, [3]int{3, 4, 1}, [3]int{tb.pathFiles, tb.pathMoves, tb.pathClimbs}, "commit path, state handlers")

	err := r.summarizeCommitPath(fields, g, "actor.nope", &tb)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `-commit "actor.nope"`)
}

func TestReactionsAreTransitive(t *testing.T) {
	r, fields := load(t)
	g := r.callGraph()
	react := r.reactions(fields, g)
	got := map[string]bool{}
	for _, f := range g.order {
		got[f.name()] = react[f.obj]
	}
	assert.Equal(t, map[string]bool{
		"actor.step": false, "jobView.bump": false, "tenancy.holds": false, "actor.note": false, "long": false,
		"decode": false, "check": false,
		"actor.upsert": true, "actor.drop": true, "StoreCoordinator.emit": true, "actor.committed": true,
	}, got)
}

func TestLongParameterLists(t *testing.T) {
	long, err := longParams(fixture)
	require.NoError(t, err)
	assert.Equal(t, []string{"other.go:9 long(8)"}, long)
}

func TestStateHandlersSelectTheActorsState(t *testing.T) {
	r, fields := load(t)
	g := r.callGraph()
	state := r.stateHandlers(fields, g)
	var got []string
	for _, f := range g.order {
		if state[f] {
			got = append(got, f.name())
		}
	}
	// committed only calls; emit writes the handle, not the actor's
	// state; decode, check and long touch no field.
	assert.ElementsMatch(t, []string{"actor.step", "actor.note", "tenancy.holds", "actor.drop", "jobView.bump", "actor.upsert"}, got)
}
