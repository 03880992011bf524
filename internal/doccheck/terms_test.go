package doccheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// renamedTerms are words the docs once used for something the code names
// otherwise: the docs say what the code says, so that a reader who
// searches the code for a word finds it. Each entry is the old word (any
// case, a whole word), the code's name the docs use instead, and the Go
// declaration that name comes from, which must still exist: when the code
// renames it again, this list fails and is brought along.
var renamedTerms = []struct {
	word *regexp.Regexp
	name string
	decl *regexp.Regexp
}{
	{regexp.MustCompile(`(?i)\bmailbox(es)?\b`), "the loop's results queue (loopIO.results, a signalQueue)",
		regexp.MustCompile(`(?m)^type signalQueue\b`)},
}

// staleTerms returns, for text, a line per renamed word it still uses.
func staleTerms(text string) []string {
	var found []string
	for i, line := range strings.Split(text, "\n") {
		for _, rt := range renamedTerms {
			for _, w := range rt.word.FindAllString(line, -1) {
				found = append(found, "line "+strconv.Itoa(i+1)+": "+w+" (the code says "+rt.name+")")
			}
		}
	}
	return found
}

// goFiles lists the module's Go files outside .git, testdata and this
// package (whose list names the old words).
func goFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	self, err := filepath.Abs(".")
	require.NoError(t, err)
	err = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			abs, _ := filepath.Abs(p)
			if d.Name() == ".git" || d.Name() == "testdata" || abs == self {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ".go") {
			files = append(files, p)
		}
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, files)
	return files
}

// TestDocsUseTheCodesNames: no Markdown file and no Go file (comments and
// help texts included) uses a word the code renamed, and every name the
// docs use instead is still declared.
func TestDocsUseTheCodesNames(t *testing.T) {
	files := append(markdownFiles(t), goFiles(t)...)
	declared := make([]bool, len(renamedTerms))
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		rel, _ := filepath.Rel(root, f)
		for _, s := range staleTerms(string(data)) {
			assert.Fail(t, "a renamed word", "%s %s", rel, s)
		}
		if strings.HasSuffix(f, ".go") {
			for i, rt := range renamedTerms {
				declared[i] = declared[i] || rt.decl.Match(data)
			}
		}
	}
	for i, rt := range renamedTerms {
		assert.True(t, declared[i], "no Go file matches %s any more: the code renamed %s again; bring renamedTerms (and the docs) along", rt.decl, rt.name)
	}
}

func TestStaleTermsAreFound(t *testing.T) {
	assert.Equal(t, []string{"line 2: Mailbox (the code says the loop's results queue (loopIO.results, a signalQueue))"},
		staleTerms("the loop's results queue\nMailbox of the loop\nmailboxing is another word"))
}
