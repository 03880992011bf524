package main

import (
	"fmt"
	"go/ast"
	"go/types"
	"slices"
	"strings"
)

// viewFile is the file that holds the job view.
const viewFile = "view.go"

// handleType is the coordinator's handle, whose fields (events, failure)
// a reaction may write.
const handleType = "StoreCoordinator"

// fn is one root function or method with a body.
type fn struct {
	obj    *types.Func
	decl   *ast.FuncDecl
	file   string
	calls  []*types.Func // in source order, each once
	writes []*types.Var  // the fields its body writes
}

// name is the function as type.method or func.
func (f *fn) name() string {
	sig := f.obj.Type().(*types.Signature)
	if sig.Recv() == nil {
		return f.obj.Name()
	}
	t := sig.Recv().Type()
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	if n, ok := t.(*types.Named); ok {
		return n.Obj().Name() + "." + f.obj.Name()
	}
	return f.obj.Name()
}

// graph is the root's call graph.
type graph struct {
	fns   map[*types.Func]*fn
	order []*fn // in file and source order
}

// origin is the declared function behind obj (generic methods are
// instantiated per use).
func origin(obj types.Object) *types.Func {
	f, ok := obj.(*types.Func)
	if !ok {
		return nil
	}
	return f.Origin()
}

// callGraph finds, for every root function with a body, the root
// functions its body names and the fields it writes.
func (r *root) callGraph() *graph {
	g := &graph{fns: map[*types.Func]*fn{}}
	for _, file := range r.files {
		name := r.file(file.Pos())
		for _, d := range file.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			obj := origin(r.info.Defs[fd.Name])
			if obj == nil {
				continue
			}
			f := &fn{obj: obj, decl: fd, file: name}
			g.fns[obj] = f
			g.order = append(g.order, f)
		}
	}
	for _, f := range g.order {
		seen := map[*types.Func]bool{}
		wseen := map[*types.Var]bool{}
		ast.Inspect(f.decl.Body, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.Ident:
				if c := origin(r.info.Uses[x]); c != nil && g.fns[c] != nil && !seen[c] {
					seen[c] = true
					f.calls = append(f.calls, c)
				}
			case *ast.SelectorExpr:
				if v := r.fieldOf(x); v != nil && r.written[x] && !wseen[v] {
					wseen[v] = true
					f.writes = append(f.writes, v)
				}
			}
			return true
		})
	}
	return g
}

// reactions is the root functions that write, themselves or through the
// functions they call, a field outside the view: an owned leaf whose
// owner's file is not view.go, or a field of the handle.
func (r *root) reactions(fields []*field, g *graph) map[*types.Func]bool {
	foreign := map[*types.Var]bool{}
	for _, f := range fields {
		if f.owned && f.file != viewFile {
			foreign[f.v] = true
		}
	}
	if tn, ok := r.pkg.Scope().Lookup(handleType).(*types.TypeName); ok {
		if s, ok := tn.Type().Underlying().(*types.Struct); ok {
			for i := range s.NumFields() {
				foreign[s.Field(i)] = true
			}
		}
	}
	react := map[*types.Func]bool{}
	for _, f := range g.order {
		for _, v := range f.writes {
			if foreign[v] {
				react[f.obj] = true
			}
		}
	}
	for changed := true; changed; {
		changed = false
		for _, f := range g.order {
			if react[f.obj] {
				continue
			}
			for _, c := range f.calls {
				if react[c] {
					react[f.obj] = true
					changed = true
					break
				}
			}
		}
	}
	return react
}

// summarizeView counts jobView's fields, the files that use the actor's
// job field, and the calls from view.go into other files' reactions.
func (r *root) summarizeView(fields []*field, g *graph, t *table) {
	if tn, ok := r.pkg.Scope().Lookup("jobView").(*types.TypeName); ok {
		if s, ok := tn.Type().Underlying().(*types.Struct); ok {
			t.jobViewFields = s.NumFields()
			fmt.Printf("  jobView fields: %d\n", s.NumFields())
		}
	}
	var jobField *types.Var
	if tn, ok := r.pkg.Scope().Lookup("actor").(*types.TypeName); ok {
		if s, ok := tn.Type().Underlying().(*types.Struct); ok {
			for i := range s.NumFields() {
				if s.Field(i).Name() == "job" {
					jobField = s.Field(i)
				}
			}
		}
	}
	react := r.reactions(fields, g)
	jobFiles := map[string]bool{}
	calls := map[string]int{}
	total := 0
	for _, file := range r.files {
		name := r.file(file.Pos())
		ast.Inspect(file, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.SelectorExpr:
				if jobField != nil && r.fieldOf(x) == jobField {
					jobFiles[name] = true
				}
			case *ast.Ident:
				if name != viewFile {
					return true
				}
				c := origin(r.info.Uses[x])
				if c == nil || !react[c] || g.fns[c].file == viewFile {
					return true
				}
				calls[g.fns[c].file+":"+g.fns[c].name()]++
				total++
			}
			return true
		})
	}
	t.jobFiles, t.viewCalls, t.viewCallees = len(jobFiles), total, len(calls)
	fmt.Printf("  files that use the actor's job field (a.job.): %d: %s\n", len(jobFiles), list(keys(jobFiles)))
	var callees []string
	for k, n := range calls {
		callees = append(callees, fmt.Sprintf("%s(%d)", k, n))
	}
	slices.Sort(callees)
	fmt.Printf("  calls from view.go into other files' reactions: %d (%d callees): %s\n", total, len(calls), list(callees))
}

// path is a walk of the call graph from the loop's entry for a landed
// commit.
type path struct {
	fns           int
	files         []string // in the order reached
	moves, climbs []string
}

// walkPath walks the call graph from entry, breadth-first in source
// order, entering only the callees keep accepts (the entry always), and
// records the files it reaches, the moves between files and the climbs
// back to a file reached earlier.
func walkPath(start *fn, g *graph, keep func(*fn) bool) path {
	rank := map[string]int{}
	var p path
	reach := func(f *fn) {
		if _, ok := rank[f.file]; !ok {
			rank[f.file] = len(p.files)
			p.files = append(p.files, f.file)
		}
	}
	seen := map[*fn]bool{start: true}
	queue := []*fn{start}
	reach(start)
	for len(queue) > 0 {
		f := queue[0]
		queue = queue[1:]
		for _, c := range f.calls {
			cf := g.fns[c]
			if !keep(cf) {
				continue
			}
			if cf.file != f.file {
				reach(cf)
				e := f.name() + "→" + cf.name()
				p.moves = append(p.moves, e)
				if rank[cf.file] < rank[f.file] {
					p.climbs = append(p.climbs, e)
				}
			}
			if !seen[cf] {
				seen[cf] = true
				reach(cf)
				queue = append(queue, cf)
			}
		}
	}
	p.fns = len(seen)
	return p
}

// stateHandlers is the root functions whose bodies (function literals
// included) select a leaf of the actor's state, to read or to write it.
func (r *root) stateHandlers(fields []*field, g *graph) map[*fn]bool {
	leaf := map[*types.Var]bool{}
	for _, f := range fields {
		leaf[f.v] = true
	}
	out := map[*fn]bool{}
	for _, f := range g.order {
		ast.Inspect(f.decl.Body, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok && leaf[r.fieldOf(sel)] {
				out[f] = true
				return false
			}
			return !out[f]
		})
	}
	return out
}

// summarizeCommitPath measures a progress commit's path twice: through
// the state handlers only (the measure, see the package doc), and
// through every call (the first definition, kept beside it).
func (r *root) summarizeCommitPath(fields []*field, g *graph, entry string, t *table) error {
	var start *fn
	for _, f := range g.order {
		if f.name() == entry {
			start = f
		}
	}
	if start == nil {
		return fmt.Errorf("-commit %q: the root package declares no such function or method (give type.method or func)", entry)
	}
	state := r.stateHandlers(fields, g)
	handlers := walkPath(start, g, func(f *fn) bool { return state[f] })
	every := walkPath(start, g, func(*fn) bool { return true })
	handlers.print(entry, "through the state handlers")
	every.print(entry, "through every call")
	t.pathFiles, t.pathMoves, t.pathClimbs = len(handlers.files), len(handlers.moves), len(handlers.climbs)
	t.allFiles, t.allMoves, t.allClimbs = len(every.files), len(every.moves), len(every.climbs)
	return nil
}

func (p path) print(entry, what string) {
	fmt.Printf("  a progress commit's path from %s %s: %d functions in %d files, %d moves between files, %d climbs back up\n",
		entry, what, p.fns, len(p.files), len(p.moves), len(p.climbs))
	fmt.Printf("    files in the order reached: %s\n", strings.Join(p.files, " "))
	fmt.Printf("    climbs: %s\n", list(p.climbs))
}
