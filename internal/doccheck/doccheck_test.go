// Package doccheck holds a test of the repository's Markdown: every
// relative link names a file that exists and, when it has an anchor, a
// heading of that file; and the docs stand alone.
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

const root = "../.."

var (
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile("(?m)^#{1,6} +(.+?) *$")
	fenceRE   = regexp.MustCompile("(?ms)^```.*?^```")
)

// markdownFiles lists the Markdown files of the repository, outside .git
// and testdata.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, files)
	return files
}

// slug is GitHub's anchor for a heading: lower case, punctuation other
// than '-' and '_' dropped, spaces to '-'.
func slug(heading string) string {
	heading = strings.ReplaceAll(heading, "`", "")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	text := fenceRE.ReplaceAllString(string(data), "")
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range headingRE.FindAllStringSubmatch(text, -1) {
		s := slug(m[1])
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

func TestSlug(t *testing.T) {
	assert.Equal(t, "the-actors-state-by-owner", slug("The actor's state, by owner"))
	assert.Equal(t, "033-key-rules-and-decorate-stay-in-the-root-package", slug("033. Key rules and `Decorate` stay in the root package"))
}

// TestRelativeLinksResolve fails on a link to a file that does not exist
// or to an anchor that no heading of its file has.
func TestRelativeLinksResolve(t *testing.T) {
	checked := 0
	for _, file := range markdownFiles(t) {
		data, err := os.ReadFile(file)
		require.NoError(t, err)
		text := fenceRE.ReplaceAllString(string(data), "")
		for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			target, anchor, _ := strings.Cut(link, "#")
			path := file
			if target != "" {
				path = filepath.Join(filepath.Dir(file), target)
			}
			rel, _ := filepath.Rel(root, file)
			info, err := os.Stat(path)
			if !assert.NoError(t, err, "%s: link %q: no such file", rel, link) {
				continue
			}
			checked++
			if anchor != "" && !info.IsDir() && strings.HasSuffix(path, ".md") {
				assert.True(t, anchors(t, path)[anchor], "%s: link %q: %s has no heading with anchor #%s", rel, link, target, anchor)
			}
		}
	}
	assert.Greater(t, checked, 50, "the docs' relative links were not found: is the pattern wrong?")
}

// pathRE finds relative paths that climb out of their directory, in
// links and in prose alike.
var pathRE = regexp.MustCompile(`(?:\.\./)+[A-Za-z0-9_.-][A-Za-z0-9_./-]*`)

// TestDocsStandAlone fails on a document that names a path outside the
// repository's own tree: a reader of the repository has nothing there.
func TestDocsStandAlone(t *testing.T) {
	abs, err := filepath.Abs(root)
	require.NoError(t, err)
	for _, file := range markdownFiles(t) {
		data, err := os.ReadFile(file)
		require.NoError(t, err)
		rel, _ := filepath.Rel(root, file)
		for _, p := range pathRE.FindAllString(string(data), -1) {
			target, err := filepath.Abs(filepath.Join(filepath.Dir(file), p))
			require.NoError(t, err)
			inside, err := filepath.Rel(abs, target)
			require.NoError(t, err)
			assert.False(t, inside == ".." || strings.HasPrefix(inside, ".."+string(filepath.Separator)),
				"%s names %s, which is outside the repository", rel, p)
		}
	}
}

func TestPathsOutsideAreFound(t *testing.T) {
	assert.Equal(t, []string{"../../x/y.md", "../z"}, pathRE.FindAllString("see ../../x/y.md and (../z)", -1))
}
