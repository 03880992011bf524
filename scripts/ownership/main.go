// Command ownership measures who owns the root package's state and how
// much of the module's API is there for its users (issue 46): a go/types
// walk over the root package that prints, for every leaf field of the
// actor's state, the files that read it and the files that write it, then
// the summary measures, then the table.
//
//	go run ./scripts/ownership            # the fields, the summary, the table
//	go run ./scripts/ownership -summary   # the summary and the table only
//
// Run it from the module's root (or pass -dir). What it counts:
//
//   - The actor's state: the fields of the root's type actor, with every
//     field whose type is an unexported struct declared in the root
//     package (an owner struct, such as jobView or leaderState; embedded
//     ones too) expanded into its own fields, recursively. A field of any
//     other type (a map, a pointer, a slice, a channel, a basic value, an
//     exported struct such as Config) is a leaf. A leaf's owner is the
//     struct that declares it, and the owner's file is the file that
//     declares that struct. Owned leaves are those whose owner is not the
//     actor itself.
//   - A write of a field: the field is on the left of an assignment or of
//     ++/--, in the left-hand chain of one (a.job.splits[id] = v writes
//     splits), the first argument of delete or clear, taken by address
//     (&a.x), or the receiver of a method with a pointer receiver. A
//     composite literal's key (construction) counts as neither a read nor
//     a write. Every other use is a read. Test files are not counted.
//   - Dirty flags are counted apart: a leaf whose name contains "dirty"
//     (any case), such as membersDirty or scopeDirty. They are the
//     "look again" bits a writer sets for another owner's step.
//   - The call graph: function A calls B when A's body (its function
//     literals included) names B, a root function or method with a body
//     (static calls and method values; calls through interfaces or
//     function values are not followed).
//   - A reaction: a root function or method that writes, itself or through
//     the root functions it calls, an owned leaf whose owner's file is not
//     view.go, or a field of the coordinator's handle (StoreCoordinator:
//     events, failure). The view's reactions are the call sites in view.go
//     that name a reaction declared in another file.
//   - A progress commit's path: the code on the loop that handles a
//     landed commit's outcome. It starts at the loop's entry for a landed
//     commit (-commit, actor.committed) and walks the call graph
//     breadth-first in source order, entering only state handlers: root
//     functions whose bodies select a leaf of the actor's state (read or
//     write it; function literals included). A function that selects no
//     such leaf is not on the path, nor are the functions only it calls:
//     pure helpers (record decoders, validators, error constructors, a
//     record's own methods), the coordinator's handle (emit), the signal
//     queue and the waker, and the I/O a closure runs beside the loop
//     (a lease delete) unless it touches the actor's state. Its files are
//     the files the path's functions are declared in; a move is a call
//     graph edge between two of them in different files; a climb back up
//     is a move into a file the walk reached before the caller's file.
//     The same walk through every call (the first definition of the
//     measure, which also counts the helpers) is printed beside it.
//   - File arrows: file A uses a package-level name or a method declared in
//     file B (B != A). The layers of the root are not written down, so an
//     arrow "back up" is measured as an arrow inside a cycle of files (its
//     two files reach each other): a layered package has none.
//   - pipeline's exported names: its package-level exported names, and how
//     many of them no file outside the package's directory names (any
//     other package of the module, tests and examples included); and the
//     lines of `go doc ./pipeline`.
//   - The root's go doc: the lines of `go doc` and the func and type lines
//     of `go doc -all`.
//   - Long parameter lists: every function (and function literal) of the
//     module, tests included, with 8 parameters or more.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	dir := flag.String("dir", ".", "the module's root directory")
	summary := flag.Bool("summary", false, "print the summary and the table only, not every field")
	commit := flag.String("commit", "actor.committed", "the loop's entry for a landed commit, as type.method or func")
	flag.Parse()
	if err := run(*dir, *summary, *commit); err != nil {
		fmt.Fprintln(os.Stderr, "ownership:", err)
		os.Exit(1)
	}
}

// table is the measures, filled by the summaries.
type table struct {
	wide, leaves                      int
	outside, owned, outsideDirty      int
	jobViewFields, jobFiles           int
	viewCalls, viewCallees            int
	pathFiles, pathMoves, pathClimbs  int
	allFiles, allMoves, allClimbs     int
	cyclicArrows, arrows              int
	pipelineDoc, pipeUnused, pipeline int
	rootDoc, rootDecls                int
	longFuncs                         int
}

func run(dir string, summaryOnly bool, commit string) error {
	r, err := loadRoot(dir)
	if err != nil {
		return err
	}
	fields, err := r.stateFields()
	if err != nil {
		return err
	}
	r.countUses(fields)
	if !summaryOnly {
		printFields(fields)
	}
	var t table
	fmt.Println("summary")
	r.summarizeFields(fields, &t)
	g := r.callGraph()
	r.summarizeView(fields, g, &t)
	if err := r.summarizeCommitPath(fields, g, commit, &t); err != nil {
		return err
	}
	r.summarizeArrows(&t)
	if err := summarizePipeline(dir, &t); err != nil {
		return err
	}
	if err := summarizeGoDoc(dir, &t); err != nil {
		return err
	}
	if err := summarizeParams(dir, &t); err != nil {
		return err
	}
	fmt.Println()
	t.print()
	return nil
}

// print writes the table of issue 46, row for row, with its goals.
func (t *table) print() {
	fmt.Println("| measure | now | goal |")
	fmt.Println("|---|---|---|")
	row := func(m, now, goal string) { fmt.Printf("| %s | %s | %s |\n", m, now, goal) }
	row("leaf state fields used from ≥ 3 root files", fmt.Sprintf("%d of %d", t.wide, t.leaves), "≤ 35")
	row("owned fields written outside their owner's file", fmt.Sprintf("%d of %d (dirty flags apart: %d)", t.outside, t.owned, t.outsideDirty), "≤ 10")
	row("`jobView` fields (`view.go`), files that use `a.job.`", fmt.Sprintf("%d, %d", t.jobViewFields, t.jobFiles), "≤ 8 fields")
	row("calls from `view.go` into other owners' reactions", fmt.Sprintf("%d (%d callees)", t.viewCalls, t.viewCallees), "0")
	row("a progress commit's path through the loop (state handlers)", fmt.Sprintf("%d files, %d moves, %d climbs back up", t.pathFiles, t.pathMoves, t.pathClimbs), "≤ 8 files")
	row("the same path through every call (the first definition)", fmt.Sprintf("%d files, %d moves, %d climbs back up", t.allFiles, t.allMoves, t.allClimbs), "")
	row("import arrows running back up the layers (file arrows inside cycles)", fmt.Sprintf("%d of %d", t.cyclicArrows, t.arrows), "")
	row("`pipeline` `go doc` lines; exported names no code outside uses", fmt.Sprintf("%d; %d of %d", t.pipelineDoc, t.pipeUnused, t.pipeline), "≤ 10 unused")
	row("root `go doc` lines; `go doc -all` func/type lines", fmt.Sprintf("%d; %d", t.rootDoc, t.rootDecls), "≤ 120 func/type")
	row("functions with ≥ 8 parameters", fmt.Sprintf("%d", t.longFuncs), "0")
}
