package spate

import (
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// selectArms returns, for function name in loop.go, each select arm as
// "channel => handler calls", one string per comm clause.
func selectArms(t *testing.T, name string) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "loop.go", nil, 0)
	require.NoError(t, err)
	src := func(n ast.Node) string {
		var b strings.Builder
		require.NoError(t, printer.Fprint(&b, fset, n))
		return b.String()
	}
	var arms []string
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Name.Name != name {
			continue
		}
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			cc, ok := n.(*ast.CommClause)
			if !ok || cc.Comm == nil {
				return true
			}
			var ch string
			ast.Inspect(cc.Comm, func(n ast.Node) bool {
				if u, ok := n.(*ast.UnaryExpr); ok && u.Op == token.ARROW {
					ch = src(u.X)
					return false
				}
				return true
			})
			var calls []string
			for _, st := range cc.Body {
				ast.Inspect(st, func(n ast.Node) bool {
					if c, ok := n.(*ast.CallExpr); ok {
						if sel, ok := c.Fun.(*ast.SelectorExpr); ok && strings.HasPrefix(sel.Sel.Name, "on") {
							calls = append(calls, src(c.Fun))
						}
					}
					return true
				})
			}
			arms = append(arms, ch+" => "+strings.Join(calls, ","))
			return true
		})
	}
	require.NotEmpty(t, arms, "no select in %s", name)
	return arms
}

// The loop's blocking select and its drain (serveReady) are two selects,
// because Go's select cannot be made non-blocking on demand without
// biasing it (decision 034). This keeps them from drifting apart: every
// input the drain serves, the loop serves through the same handler, and
// every input of the loop's is either drained or one of the inputs that
// are served once per wake-up by design.
func TestTheDrainServesTheLoopsInputsAlike(t *testing.T) {
	loop, drain := selectArms(t, "loop"), selectArms(t, "serveReady")
	for _, arm := range drain {
		assert.Contains(t, loop, arm, "the drain serves an input the loop does not, or through another handler")
	}
	// The loop's end, the renewer's notes (a lease beat, no hurry), the
	// timers and retries, the planner's asks for a run (like replan.C, a
	// flag the next step reads), and the planner's one result at a time.
	oncePerWakeUp := []string{
		"ctx.Done()", "a.renew.notes.sig",
		"a.w.rewatch.C", "tick.C", "a.wake.c()", "reconcile.C", "replan.C",
		"planTriggers", "a.planning.done",
	}
	for _, arm := range loop {
		ch := strings.TrimSpace(strings.SplitN(arm, "=>", 2)[0])
		if slices.Contains(oncePerWakeUp, ch) {
			continue
		}
		assert.Contains(t, drain, arm, "an input of the loop's that the drain does not serve: after one of it, the others wait a step")
	}
	assert.Len(t, drain, 5, "the drain's inputs: commands, I/O results, the two whole-job watches, the key groups")
}
