package doccheck

import (
	"go/scanner"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// One word, one meaning (docs/decisions/035-one-meaning-per-name.md): a
// "driver" is a store backend. The pipeline's adapter keeps the name the
// user's design gave it, CoordinationDriver, and prose calls it "the
// coordination driver" in full; a lane goroutine is a "runner". In the
// packages that have no store driver of their own, every "driver" in a
// comment or a string literal must therefore be "coordination driver".
// (pipeline/blobsink and pipeline/filesource/blobsource are not checked:
// there a driver is the Go CDK's bucket driver, a store backend.)
var coordinationOnly = []string{"pipeline", "pipeline/filesource"}

var bareDriverRE = regexp.MustCompile(`(?i)(\w*)(\s+)driver(s|'s)?\b`)

// bareDrivers returns, for Go source src, the comments and string literals
// that say "driver" without "coordination" before it.
func bareDrivers(src []byte) []string {
	var s scanner.Scanner
	fset := token.NewFileSet()
	s.Init(fset.AddFile("", -1, len(src)), src, nil, scanner.ScanComments)
	var found []string
	// last is the last word of the comment line before, so that a
	// "coordination" ending one line still counts for the next.
	last := ""
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			return found
		}
		if tok != token.COMMENT && tok != token.STRING {
			last = ""
			continue
		}
		text := " " + lit
		if tok == token.COMMENT {
			text = last + " " + strings.TrimPrefix(lit, "//")
			words := strings.Fields(text)
			last = ""
			if len(words) > 0 {
				last = words[len(words)-1]
			}
		}
		for _, b := range bareIn(text) {
			found = append(found, fset.Position(pos).String()+": "+b)
		}
	}
}

// bareIn returns each "driver" in text without "coordination" before it.
func bareIn(text string) []string {
	var found []string
	for _, m := range bareDriverRE.FindAllStringSubmatch(text, -1) {
		if !strings.EqualFold(m[1], "coordination") {
			found = append(found, strings.TrimSpace(m[0]))
		}
	}
	return found
}

func TestBareDriversAreFound(t *testing.T) {
	src := []byte("package p\n" +
		"// The driver stops the lane.\n" +
		"// The coordination driver stops it; Driver\n" +
		"// the coordination\n// driver, wrapped.\n" +
		"var e = \"the driver's logger\"\n" +
		"var CoordinationDriver, DriverOption int\n")
	found := bareDrivers(src)
	require.Len(t, found, 3, "%q", found)
	assert.Contains(t, found[0], "The driver")
	assert.Equal(t, "3:1: Driver", found[1])
	assert.Contains(t, found[2], "the driver's")
}

func TestThePipelineSaysCoordinationDriver(t *testing.T) {
	checked := 0
	for _, dir := range coordinationOnly {
		files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
		require.NoError(t, err)
		for _, f := range files {
			src, err := os.ReadFile(f)
			require.NoError(t, err)
			checked++
			for _, b := range bareDrivers(src) {
				t.Errorf("%s:%s: say \"coordination driver\" (a driver is a store backend; a lane goroutine is a runner)", f, b)
			}
		}
	}
	require.Greater(t, checked, 20, "the pipeline's files were not found")

	// The pipeline's own page, likewise.
	page, err := os.ReadFile(filepath.Join(root, "docs", "pipeline.md"))
	require.NoError(t, err)
	for _, b := range bareIn(" " + strings.Join(strings.Fields(string(page)), " ")) {
		t.Errorf("docs/pipeline.md: %q: say \"coordination driver\" (a driver is a store backend; a lane goroutine is a runner)", b)
	}
}
