package main

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

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
func summarizePipeline(dir string, t *table) error {
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
	doc, err := goDoc(dir, "./pipeline")
	if err != nil {
		return err
	}
	t.pipelineDoc, t.pipeUnused, t.pipeline = strings.Count(doc, "\n"), len(unused), len(exported)
	fmt.Printf("  pipeline go doc: %d lines\n", t.pipelineDoc)
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
func summarizeGoDoc(dir string, t *table) error {
	short, err := goDoc(dir, ".")
	if err != nil {
		return err
	}
	all, err := goDoc(dir, "-all", ".")
	if err != nil {
		return err
	}
	decls := 0
	for _, l := range strings.Split(all, "\n") {
		if strings.HasPrefix(l, "func ") || strings.HasPrefix(l, "type ") {
			decls++
		}
	}
	t.rootDoc, t.rootDecls = strings.Count(short, "\n"), decls
	fmt.Printf("  root go doc: %d lines; go doc -all: %d func/type lines\n", strings.Count(short, "\n"), decls)
	return nil
}

// goDoc runs go doc with args (the package last) in dir.
func goDoc(dir string, args ...string) (string, error) {
	cmd := exec.Command("go", append([]string{"doc"}, args...)...)
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
func summarizeParams(dir string, t *table) error {
	long, err := longParams(dir)
	if err != nil {
		return err
	}
	t.longFuncs = len(long)
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
