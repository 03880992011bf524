// Command ownership measures who owns the root package's state and how
// much of the module's API is there for its users (issue 46): a go/types
// walk over the root package that prints, for every leaf field of the
// actor's state, the files that read it and the files that write it, then
// the summary measures.
//
//	go run ./internal/ownership            # the fields, then the summary
//	go run ./internal/ownership -summary   # the summary only
//
// Run it from the module's root (or pass -dir). What it counts:
//
//   - The actor's state: the fields of the root's type actor, with every
//     field whose type is an unexported struct declared in the root
//     package (an owner struct, such as jobView or leaderState; embedded
//     ones too) expanded into its own fields, recursively. A field of any
//     other type (a map, a pointer, a slice, a channel, a basic value, an
//     exported struct such as Config) is a leaf. A leaf's
//     owner is the struct that declares it, and the owner's file is the
//     file that declares that struct. Owned leaves are those whose owner
//     is not the actor itself.
//   - A write of a field: the field is on the left of an assignment or of
//     ++/--, in the left-hand chain of one (a.job.splits[id] = v writes
//     splits), the first argument of delete or clear, taken by address
//     (&a.x), or the receiver of a method with a pointer receiver. A
//     composite literal's key (construction) counts as neither a read nor
//     a write. Every other use is a read. Test files are not counted.
//   - Dirty flags (a leaf whose name contains "dirty") are counted apart.
//   - The view's reactions: calls from view.go to methods of the actor or
//     of an owner struct declared in another file.
//   - File arrows: file A uses a package-level name or a method declared in
//     file B (B != A). The layers of the root are not written down, so an
//     arrow "back up" is measured as an arrow inside a cycle of files (its
//     two files reach each other): a layered package has none.
//   - pipeline's exported names: its package-level exported names, and how
//     many of them no file outside the package's directory names (any
//     other package of the module, tests and examples included).
//   - The root's go doc: the lines of `go doc` and the func and type lines
//     of `go doc -all`.
//   - Long parameter lists: every function (and function literal) of the
//     module, tests included, with 8 parameters or more.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/build"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

func main() {
	dir := flag.String("dir", ".", "the module's root directory")
	summary := flag.Bool("summary", false, "print the summary only, not every field")
	flag.Parse()
	if err := run(*dir, *summary); err != nil {
		fmt.Fprintln(os.Stderr, "ownership:", err)
		os.Exit(1)
	}
}

func run(dir string, summaryOnly bool) error {
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
	fmt.Println("summary")
	r.summarizeFields(fields)
	r.summarizeView()
	r.summarizeArrows()
	if err := summarizePipeline(dir); err != nil {
		return err
	}
	if err := summarizeGoDoc(dir); err != nil {
		return err
	}
	return summarizeParams(dir)
}

// root is the type-checked root package, without its tests.
type root struct {
	fset  *token.FileSet
	files []*ast.File
	pkg   *types.Package
	info  *types.Info
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

// countUses records, for every leaf, the files that read and write it.
func (r *root) countUses(fields []*field) {
	byVar := map[*types.Var]*field{}
	for _, f := range fields {
		byVar[f.v] = f
	}
	for _, file := range r.files {
		name := r.file(file.Pos())
		written := map[*ast.SelectorExpr]bool{}
		markChain := func(e ast.Expr) {
			for e != nil {
				switch x := e.(type) {
				case *ast.SelectorExpr:
					written[x] = true
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
		ast.Inspect(file, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			s := r.info.Selections[sel]
			if s == nil || s.Kind() != types.FieldVal {
				return true
			}
			f := byVar[s.Obj().(*types.Var)]
			if f == nil {
				return true
			}
			if written[sel] {
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

func (r *root) summarizeFields(fields []*field) {
	var wide, owned, outside, outsideDirty []string
	for _, f := range fields {
		if len(f.users()) >= 3 {
			wide = append(wide, fmt.Sprintf("%s(%d)", f.path, len(f.users())))
		}
		if !f.owned {
			continue
		}
		owned = append(owned, f.path)
		if w := f.writtenOutside(); len(w) > 0 {
			e := fmt.Sprintf("%s(%s)", f.path, strings.Join(w, ","))
			if isDirty(f) {
				outsideDirty = append(outsideDirty, e)
			} else {
				outside = append(outside, e)
			}
		}
	}
	fmt.Printf("  leaf state fields used from >= 3 root files: %d of %d\n", len(wide), len(fields))
	fmt.Printf("    %s\n", strings.Join(wide, " "))
	fmt.Printf("  owned fields written outside their owner's file: %d of %d (dirty flags apart: %d more)\n",
		len(outside), len(owned), len(outsideDirty))
	fmt.Printf("    %s\n", strings.Join(outside, " "))
	if len(outsideDirty) > 0 {
		fmt.Printf("    dirty flags: %s\n", strings.Join(outsideDirty, " "))
	}
}

// summarizeView counts jobView's fields, the files that use the actor's
// job field, and the calls from view.go into other files' reactions.
func (r *root) summarizeView() {
	if tn, ok := r.pkg.Scope().Lookup("jobView").(*types.TypeName); ok {
		if s, ok := tn.Type().Underlying().(*types.Struct); ok {
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
	jobFiles := map[string]bool{}
	calls := map[string]int{}
	for _, file := range r.files {
		name := r.file(file.Pos())
		ast.Inspect(file, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.SelectorExpr:
				if s := r.info.Selections[x]; s != nil && jobField != nil && s.Obj() == jobField {
					jobFiles[name] = true
				}
			case *ast.CallExpr:
				if name != "view.go" {
					return true
				}
				sel, ok := x.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				s := r.info.Selections[sel]
				if s == nil || s.Kind() != types.MethodVal {
					return true
				}
				fn := s.Obj().(*types.Func)
				if fn.Pkg() != r.pkg || r.file(fn.Pos()) == "view.go" {
					return true
				}
				recv := fn.Type().(*types.Signature).Recv().Type()
				if p, ok := recv.(*types.Pointer); ok {
					recv = p.Elem()
				}
				if on, _ := r.ownerStruct(recv, false); on != nil {
					calls[r.file(fn.Pos())+":"+fn.Name()]++
				}
			}
			return true
		})
	}
	total := 0
	for _, c := range calls {
		total += c
	}
	fmt.Printf("  files that use the actor's job field (a.job.): %d: %s\n", len(jobFiles), list(keys(jobFiles)))
	callees := keys(map[string]bool{})
	for k := range calls {
		callees = append(callees, k)
	}
	slices.Sort(callees)
	fmt.Printf("  calls from view.go into other files' reactions: %d (%d methods): %s\n", total, len(calls), list(callees))
}

// summarizeArrows counts the file arrows and those inside cycles.
func (r *root) summarizeArrows() {
	arrows := map[[2]string]bool{}
	for _, file := range r.files {
		from := r.file(file.Pos())
		add := func(obj types.Object) {
			if obj == nil || obj.Pkg() != r.pkg || !obj.Pos().IsValid() {
				return
			}
			fn, isFunc := obj.(*types.Func)
			method := isFunc && fn.Type().(*types.Signature).Recv() != nil
			if obj.Parent() != r.pkg.Scope() && !method {
				return
			}
			if to := r.file(obj.Pos()); to != from {
				arrows[[2]string{from, to}] = true
			}
		}
		ast.Inspect(file, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.Ident:
				add(r.info.Uses[x])
			case *ast.SelectorExpr:
				if s := r.info.Selections[x]; s != nil && s.Kind() != types.FieldVal {
					add(s.Obj())
				}
			}
			return true
		})
	}
	// Tarjan's strongly connected components over the files.
	next := map[string][]string{}
	for a := range arrows {
		next[a[0]] = append(next[a[0]], a[1])
	}
	index, low, comp := map[string]int{}, map[string]int{}, map[string]int{}
	onStack := map[string]bool{}
	var stack []string
	n, c := 0, 0
	var visit func(v string)
	visit = func(v string) {
		index[v], low[v] = n, n
		n++
		stack = append(stack, v)
		onStack[v] = true
		for _, w := range next[v] {
			if _, ok := index[w]; !ok {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if onStack[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] == index[v] {
			for {
				w := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				onStack[w] = false
				comp[w] = c
				if w == v {
					break
				}
			}
			c++
		}
	}
	var nodes []string
	for _, f := range r.files {
		nodes = append(nodes, r.file(f.Pos()))
	}
	for _, v := range nodes {
		if _, ok := index[v]; !ok {
			visit(v)
		}
	}
	cyclic := 0
	size := map[int]int{}
	for _, v := range nodes {
		size[comp[v]]++
	}
	biggest := 0
	for a := range arrows {
		if comp[a[0]] == comp[a[1]] {
			cyclic++
		}
	}
	for _, s := range size {
		biggest = max(biggest, s)
	}
	fmt.Printf("  file arrows inside cycles (\"back up the layers\"): %d of %d; the largest cycle of files holds %d of %d files\n",
		cyclic, len(arrows), biggest, len(nodes))
}

// modFiles is every .go file of the module under dir, outside testdata,
// vendor and hidden directories and nested modules.
func modFiles(dir string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if p != dir && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			if p != dir {
				if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if strings.HasSuffix(p, ".go") {
			out = append(out, p)
		}
		return nil
	})
	return out, err
}

// summarizePipeline counts pipeline's exported package-level names and
// those no file outside its directory names.
func summarizePipeline(dir string) error {
	pdir := filepath.Join(dir, "pipeline")
	bp, err := build.ImportDir(pdir, 0)
	if err != nil {
		return fmt.Errorf("the pipeline package: %w", err)
	}
	mod, err := modulePath(dir)
	if err != nil {
		return err
	}
	importPath := mod + "/pipeline"
	fset := token.NewFileSet()
	exported := map[string]string{} // name: its kind
	for _, name := range bp.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(pdir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil && d.Name.IsExported() {
					exported[d.Name.Name] = "func"
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							exported[s.Name.Name] = "type"
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								exported[n.Name] = d.Tok.String()
							}
						}
					}
				}
			}
		}
	}
	files, err := modFiles(dir)
	if err != nil {
		return err
	}
	used := map[string]bool{}
	for _, p := range files {
		if filepath.Dir(p) == filepath.Clean(pdir) {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		local := ""
		for _, im := range f.Imports {
			if strings.Trim(im.Path.Value, `"`) == importPath {
				local = "pipeline"
				if im.Name != nil {
					local = im.Name.Name
				}
			}
		}
		if local == "" {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == local {
					used[sel.Sel.Name] = true
				}
			}
			return true
		})
	}
	var unused []string
	typesFuncs, unusedTF := 0, 0
	for name, kind := range exported {
		tf := kind == "type" || kind == "func"
		if tf {
			typesFuncs++
		}
		if !used[name] {
			unused = append(unused, name)
			if tf {
				unusedTF++
			}
		}
	}
	slices.Sort(unused)
	fmt.Printf("  pipeline exported names no code outside the package uses: %d of %d (types and funcs: %d of %d)\n    %s\n",
		len(unused), len(exported), unusedTF, typesFuncs, list(unused))
	return nil
}

// modulePath is the module path go.mod in dir declares.
func modulePath(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if m, ok := strings.CutPrefix(strings.TrimSpace(l), "module "); ok {
			return strings.Trim(strings.TrimSpace(m), `"`), nil
		}
	}
	return "", fmt.Errorf("%s: no module line", filepath.Join(dir, "go.mod"))
}

// summarizeGoDoc counts the root's go doc lines.
func summarizeGoDoc(dir string) error {
	short, err := goDoc(dir)
	if err != nil {
		return err
	}
	all, err := goDoc(dir, "-all")
	if err != nil {
		return err
	}
	decls := 0
	for _, l := range strings.Split(all, "\n") {
		if strings.HasPrefix(l, "func ") || strings.HasPrefix(l, "type ") {
			decls++
		}
	}
	fmt.Printf("  root go doc: %d lines; go doc -all: %d func/type lines\n", strings.Count(short, "\n"), decls)
	return nil
}

func goDoc(dir string, args ...string) (string, error) {
	cmd := exec.Command("go", append(append([]string{"doc"}, args...), ".")...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go doc %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

// summarizeParams lists the module's functions with 8 parameters or more.
func summarizeParams(dir string) error {
	long, err := longParams(dir)
	if err != nil {
		return err
	}
	fmt.Printf("  functions with >= 8 parameters: %d\n    %s\n", len(long), list(long))
	return nil
}

// longParams is the module's functions with 8 parameters or more, as
// file:line name(count).
func longParams(dir string) ([]string, error) {
	files, err := modFiles(dir)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var long []string
	for _, p := range files {
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			var ft *ast.FuncType
			name := "func literal"
			switch x := n.(type) {
			case *ast.FuncDecl:
				ft, name = x.Type, x.Name.Name
			case *ast.FuncLit:
				ft = x.Type
			}
			if ft == nil {
				return true
			}
			params := 0
			for _, fl := range ft.Params.List {
				params += max(len(fl.Names), 1)
			}
			if params >= 8 {
				rel, _ := filepath.Rel(dir, fset.Position(ft.Pos()).Filename)
				long = append(long, fmt.Sprintf("%s:%d %s(%d)", rel, fset.Position(ft.Pos()).Line, name, params))
			}
			return true
		})
	}
	return long, nil
}
