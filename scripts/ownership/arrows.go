package main

import (
	"fmt"
	"go/ast"
	"go/types"
)

// summarizeArrows counts the file arrows and those inside cycles.
func (r *root) summarizeArrows(t *table) {
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
	t.cyclicArrows, t.arrows = cyclic, len(arrows)
	fmt.Printf("  file arrows inside cycles (\"back up the layers\"): %d of %d; the largest cycle of files holds %d of %d files\n",
		cyclic, len(arrows), biggest, len(nodes))
}
