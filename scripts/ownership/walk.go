package main

import (
	"fmt"
	"go/ast"
	"go/build"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"path/filepath"
	"slices"
	"strings"
)

// root is the type-checked root package, without its tests.
type root struct {
	fset  *token.FileSet
	files []*ast.File
	pkg   *types.Package
	info  *types.Info
	// written is every selector that is written (see markWrites).
	written map[*ast.SelectorExpr]bool
}

func loadRoot(dir string) (*root, error) {
	bp, err := build.ImportDir(dir, 0)
	if err != nil {
		return nil, fmt.Errorf("the root package in %s: %w", dir, err)
	}
	r := &root{fset: token.NewFileSet(), info: &types.Info{
		Uses:       map[*ast.Ident]types.Object{},
		Defs:       map[*ast.Ident]types.Object{},
		Selections: map[*ast.SelectorExpr]*types.Selection{},
		Types:      map[ast.Expr]types.TypeAndValue{},
	}}
	for _, name := range bp.GoFiles {
		f, err := parser.ParseFile(r.fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		r.files = append(r.files, f)
	}
	conf := types.Config{Importer: importer.ForCompiler(r.fset, "source", nil)}
	r.pkg, err = conf.Check(bp.ImportPath, r.fset, r.files, r.info)
	if err != nil {
		return nil, fmt.Errorf("type-check the root package: %w", err)
	}
	r.markWrites()
	return r, nil
}

// file is the base name of the file that holds pos.
func (r *root) file(pos token.Pos) string {
	return filepath.Base(r.fset.Position(pos).Filename)
}

// ownerStruct is the root struct type t names (through a pointer for an
// embedded one), nil when it is not one.
func (r *root) ownerStruct(t types.Type, embedded bool) (*types.Named, *types.Struct) {
	if p, ok := t.(*types.Pointer); ok && embedded {
		t = p.Elem()
	}
	n, ok := t.(*types.Named)
	if !ok || n.Obj().Pkg() != r.pkg || n.Obj().Exported() {
		return nil, nil
	}
	s, ok := n.Underlying().(*types.Struct)
	if !ok {
		return nil, nil
	}
	return n, s
}

// field is one leaf of the actor's state.
type field struct {
	v       *types.Var
	path    string // actor.job.splits
	owner   string // the declaring struct
	file    string // the owner's file
	owned   bool   // the owner is not the actor
	readers map[string]bool
	writers map[string]bool
}

func (r *root) stateFields() ([]*field, error) {
	obj, ok := r.pkg.Scope().Lookup("actor").(*types.TypeName)
	if !ok {
		return nil, fmt.Errorf("the root package declares no type actor")
	}
	var out []*field
	seen := map[*types.Named]bool{}
	var walk func(n *types.Named, s *types.Struct, path string)
	walk = func(n *types.Named, s *types.Struct, path string) {
		seen[n] = true
		for i := range s.NumFields() {
			fv := s.Field(i)
			p := path + "." + fv.Name()
			if on, ost := r.ownerStruct(fv.Type(), fv.Embedded()); on != nil && !seen[on] {
				walk(on, ost, p)
				continue
			}
			out = append(out, &field{v: fv, path: p, owner: n.Obj().Name(), file: r.file(n.Obj().Pos()),
				owned: n.Obj() != obj, readers: map[string]bool{}, writers: map[string]bool{}})
		}
	}
	n := obj.Type().(*types.Named)
	walk(n, n.Underlying().(*types.Struct), "actor")
	return out, nil
}

// markWrites finds every selector expression that is written: on the
// left of an assignment or ++/-- (the whole chain a.job.splits[id]),
// the first argument of delete or clear, taken by address, or the
// receiver of a pointer-receiver method.
func (r *root) markWrites() {
	r.written = map[*ast.SelectorExpr]bool{}
	markChain := func(e ast.Expr) {
		for e != nil {
			switch x := e.(type) {
			case *ast.SelectorExpr:
				r.written[x] = true
				e = x.X
			case *ast.IndexExpr:
				e = x.X
			case *ast.StarExpr:
				e = x.X
			case *ast.ParenExpr:
				e = x.X
			default:
				e = nil
			}
		}
	}
	for _, file := range r.files {
		ast.Inspect(file, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.AssignStmt:
				if x.Tok != token.DEFINE {
					for _, l := range x.Lhs {
						markChain(l)
					}
				}
			case *ast.IncDecStmt:
				markChain(x.X)
			case *ast.RangeStmt:
				if x.Tok == token.ASSIGN {
					markChain(x.Key)
					markChain(x.Value)
				}
			case *ast.UnaryExpr:
				if x.Op == token.AND {
					markChain(x.X)
				}
			case *ast.CallExpr:
				if id, ok := x.Fun.(*ast.Ident); ok && len(x.Args) > 0 {
					if b, ok := r.info.Uses[id].(*types.Builtin); ok && (b.Name() == "delete" || b.Name() == "clear") {
						markChain(x.Args[0])
					}
				}
				if sel, ok := x.Fun.(*ast.SelectorExpr); ok {
					if s := r.info.Selections[sel]; s != nil && s.Kind() == types.MethodVal {
						if sig, ok := s.Obj().Type().(*types.Signature); ok && sig.Recv() != nil {
							if _, ptr := sig.Recv().Type().(*types.Pointer); ptr {
								if _, isPtr := r.info.Types[sel.X].Type.(*types.Pointer); !isPtr {
									markChain(sel.X)
								}
							}
						}
					}
				}
			}
			return true
		})
	}
}

// fieldOf is the field sel selects, nil when it selects no field.
func (r *root) fieldOf(sel *ast.SelectorExpr) *types.Var {
	s := r.info.Selections[sel]
	if s == nil || s.Kind() != types.FieldVal {
		return nil
	}
	return s.Obj().(*types.Var)
}

// countUses records, for every leaf, the files that read and write it.
func (r *root) countUses(fields []*field) {
	byVar := map[*types.Var]*field{}
	for _, f := range fields {
		byVar[f.v] = f
	}
	for _, file := range r.files {
		name := r.file(file.Pos())
		ast.Inspect(file, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			f := byVar[r.fieldOf(sel)]
			if f == nil {
				return true
			}
			if r.written[sel] {
				f.writers[name] = true
			} else {
				f.readers[name] = true
			}
			return true
		})
	}
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// users is the files that read or write f.
func (f *field) users() map[string]bool {
	u := map[string]bool{}
	for k := range f.readers {
		u[k] = true
	}
	for k := range f.writers {
		u[k] = true
	}
	return u
}

// writtenOutside is the files other than the owner's that write f.
func (f *field) writtenOutside() []string {
	var out []string
	for _, w := range keys(f.writers) {
		if w != f.file {
			out = append(out, w)
		}
	}
	return out
}

func printFields(fields []*field) {
	fmt.Println("field (owner, owner's file): read by; written by")
	for _, f := range fields {
		fmt.Printf("%s (%s, %s): read %s; written %s\n", f.path, f.owner, f.file,
			list(keys(f.readers)), list(keys(f.writers)))
	}
	fmt.Println()
}

func list(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, " ")
}

func isDirty(f *field) bool { return strings.Contains(strings.ToLower(f.v.Name()), "dirty") }

func (r *root) summarizeFields(fields []*field, t *table) {
	var wide, outside, outsideDirty []string
	owned, dirty := 0, 0
	for _, f := range fields {
		if len(f.users()) >= 3 {
			wide = append(wide, fmt.Sprintf("%s(%d)", f.path, len(f.users())))
		}
		if !f.owned {
			continue
		}
		if isDirty(f) {
			dirty++
		} else {
			owned++
		}
		if w := f.writtenOutside(); len(w) > 0 {
			e := fmt.Sprintf("%s(%s)", f.path, strings.Join(w, ","))
			if isDirty(f) {
				outsideDirty = append(outsideDirty, e)
			} else {
				outside = append(outside, e)
			}
		}
	}
	t.wide, t.leaves = len(wide), len(fields)
	t.outside, t.owned, t.outsideDirty = len(outside), owned, len(outsideDirty)
	fmt.Printf("  leaf state fields used from >= 3 root files: %d of %d\n", len(wide), len(fields))
	fmt.Printf("    %s\n", list(wide))
	fmt.Printf("  owned fields (dirty flags apart) written outside their owner's file: %d of %d\n", len(outside), owned)
	fmt.Printf("    %s\n", list(outside))
	fmt.Printf("  owned dirty flags written outside their owner's file: %d of %d\n", len(outsideDirty), dirty)
	fmt.Printf("    %s\n", list(outsideDirty))
}
