package doccheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// notOurs are qualified names the docs use that belong to a package of
// another module whose name one of ours shares, with where they are from.
var notOurs = map[string]string{
	"driver.Bucket": "the Go CDK's gocloud.dev/blob/driver, which package driver is modelled on",
}

// modulePackages maps the name of each of the module's packages (package
// main aside) to the names it
// declares: its package-level names, its types' methods, fields and
// interface methods as Type.Name, and what its test files declare (a test
// the docs cite by name).
func modulePackages(t *testing.T) map[string]map[string]bool {
	t.Helper()
	type pkg struct {
		dirs  map[string]bool
		names map[string]bool
	}
	pkgs := map[string]*pkg{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "node_modules" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		name := strings.TrimSuffix(f.Name.Name, "_test")
		if name == "main" {
			return nil
		}
		k := pkgs[name]
		if k == nil {
			k = &pkg{dirs: map[string]bool{}, names: map[string]bool{}}
			pkgs[name] = k
		}
		k.dirs[filepath.Dir(p)] = true
		for n := range declared(f) {
			k.names[n] = true
		}
		return nil
	})
	require.NoError(t, err)
	out := map[string]map[string]bool{}
	for name, k := range pkgs {
		// A name several directories declare is the one whose directory
		// bears it (package conformance is conformance/, not
		// examples/conformance-etcd); with none or several such, the name
		// is ambiguous and not checked.
		dirs := 0
		for d := range k.dirs {
			if len(k.dirs) == 1 || filepath.Base(d) == name {
				dirs++
			}
		}
		if dirs == 1 {
			out[name] = k.names
		}
	}
	return out
}

// declared is what f declares at package level, with its types' methods,
// fields and interface methods as Type.Name.
func declared(f *ast.File) map[string]bool {
	out := map[string]bool{}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil || len(d.Recv.List) == 0 {
				out[d.Name.Name] = true
				continue
			}
			if recv := receiver(d.Recv.List[0].Type); recv != "" {
				out[recv+"."+d.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					out[s.Name.Name] = true
					var members *ast.FieldList
					switch ty := s.Type.(type) {
					case *ast.StructType:
						members = ty.Fields
					case *ast.InterfaceType:
						members = ty.Methods
					}
					if members == nil {
						continue
					}
					for _, m := range members.List {
						for _, n := range m.Names {
							out[s.Name.Name+"."+n.Name] = true
						}
						if len(m.Names) == 0 { // embedded: named by its type
							if e := receiver(m.Type); e != "" {
								out[s.Name.Name+"."+e] = true
							}
						}
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						out[n.Name] = true
					}
				}
			}
		}
	}
	return out
}

// receiver is the type name of a method's receiver or an embedded field:
// T, *T, T[P], pkg.T.
func receiver(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return receiver(e.X)
	case *ast.IndexExpr:
		return receiver(e.X)
	case *ast.IndexListExpr:
		return receiver(e.X)
	case *ast.SelectorExpr:
		return e.Sel.Name
	case *ast.Ident:
		return e.Name
	}
	return ""
}

// qualifiedRE finds pkg.Name and pkg.Name.Member in text; the caller keeps
// those whose pkg is one of the module's packages. A name after a path
// (gocloud.dev/blob/driver.Bucket) or another selector is not one.
var qualifiedRE = regexp.MustCompile(`(^|[^\w./])([a-z][a-z0-9]*)\.([A-Z]\w*)(?:\.([A-Z]\w*))?`)

// staleNames returns, for text, a line per qualified name of one of pkgs
// that the package does not declare.
func staleNames(text string, pkgs map[string]map[string]bool) []string {
	var found []string
	for i, line := range strings.Split(text, "\n") {
		for _, m := range qualifiedRE.FindAllStringSubmatch(line, -1) {
			pkg, name, member := m[2], m[3], m[4]
			names, ours := pkgs[pkg]
			if !ours {
				continue
			}
			ref := pkg + "." + name
			if _, ok := notOurs[ref]; ok || names[name] && (member == "" || names[name+"."+member]) {
				continue
			}
			if member != "" && names[name] {
				ref += "." + member
			}
			found = append(found, "line "+strconv.Itoa(i+1)+": "+ref)
		}
	}
	return found
}

// TestDocsNameWhatTheCodeDeclares: every qualified name a Markdown file
// gives of one of the module's packages (spate.Store,
// scale.MeasureLifecycle, pipeline.Config.Threads) is declared there, so
// that a rename or a move that leaves the docs behind fails here rather
// than sending a reader to a name that is gone.
func TestDocsNameWhatTheCodeDeclares(t *testing.T) {
	pkgs := modulePackages(t)
	for _, p := range []string{"spate", "conformance", "pipeline", "scale"} {
		require.NotEmpty(t, pkgs[p], "package %s was not found: is the walk wrong?", p)
	}
	checked := 0
	for _, file := range markdownFiles(t) {
		data, err := os.ReadFile(file)
		require.NoError(t, err)
		rel, _ := filepath.Rel(root, file)
		for _, s := range staleNames(string(data), pkgs) {
			assert.Fail(t, "a name the code does not declare", "%s %s", rel, s)
		}
		checked += len(qualifiedRE.FindAllString(string(data), -1))
	}
	assert.Greater(t, checked, 100, "the docs' qualified names were not found: is the pattern wrong?")
	for ref := range notOurs {
		pkg, name, _ := strings.Cut(ref, ".")
		assert.False(t, pkgs[pkg][name], "%s is declared in the module now: drop it from notOurs", ref)
	}
}

func TestStaleNamesAreFound(t *testing.T) {
	pkgs := map[string]map[string]bool{"pipeline": {"Config": true, "Config.Threads": true, "Build": true}}
	found := staleNames("pipeline.Build(pipeline.Config{})\n"+
		"`pipeline.Config.Threads`, pipeline.Config.Shards and pipeline.Source\n"+
		"other.Thing, gocloud.dev/blob/pipeline.Gone, x.pipeline.Gone, pipeline.md", pkgs)
	assert.Equal(t, []string{"line 2: pipeline.Config.Shards", "line 2: pipeline.Source"}, found)
}
