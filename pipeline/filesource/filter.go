package filesource

import (
	"fmt"
	"path"
	"strings"
)

// DefaultFollowExcludes are the patterns a following job ([PlannerOptions]
// Follow) leaves out unless its Exclude is set: the files a log rotation
// leaves beside a live log, which hold lines already read from it (or
// compressed bytes, which are not lines). They are
//
//   - a numbered copy or rename, as logrotate's default names it:
//     app.log.1 … app.log.999 (copytruncate's copy, or create's rename);
//   - a dated copy or rename (logrotate's dateext): app.log-20261207 or,
//     hourly, app.log-2026120713;
//   - a compressed archive: *.gz, *.bz2, *.xz, *.zst, *.zip, *.lz4.
//
// A file that was followed and is then renamed to such a name keeps its
// split (a split follows its file, not its name): the lines written to it
// after the rename are still read, and its split parks once it is idle
// ([PlannerOptions] ReleaseAfter), to be read on if it grows again.
var DefaultFollowExcludes = []string{
	"*.[0-9]", "*.[0-9][0-9]", "*.[0-9][0-9][0-9]",
	"*-[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]",
	"*-[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]",
	"*.gz", "*.bz2", "*.xz", "*.zst", "*.zip", "*.lz4",
}

// fileFilter decides which files of the input are planned: a file is in
// when it matches an include pattern (or there are none) and no exclude
// pattern. A pattern without a slash matches a file's base name; one with
// a slash matches its whole path relative to the root. Patterns are
// path.Match globs.
type fileFilter struct {
	include, exclude []string
}

// newFileFilter builds the filter of opts, checking every pattern.
func newFileFilter(opts PlannerOptions) (fileFilter, error) {
	f := fileFilter{include: opts.Include, exclude: opts.Exclude}
	if opts.Follow && !opts.NoDefaultExcludes && len(opts.Exclude) == 0 {
		f.exclude = DefaultFollowExcludes
	}
	for _, set := range [][]string{f.include, f.exclude} {
		if err := ValidatePatterns(set); err != nil {
			return f, err
		}
	}
	return f, nil
}

// ValidatePatterns checks include or exclude patterns: each must be a
// valid path.Match glob, non-empty, relative (no leading slash).
func ValidatePatterns(patterns []string) error {
	for _, p := range patterns {
		if p == "" || strings.HasPrefix(p, "/") {
			return fmt.Errorf("filesource: pattern %q: want a glob on the path relative to the input's root, such as '*.log' or 'app/*.log'", p)
		}
		if _, err := path.Match(p, ""); err != nil {
			return fmt.Errorf("filesource: pattern %q: %w (a path.Match glob: * ? [a-z] and \\ escapes)", p, err)
		}
	}
	return nil
}

// match reports whether the file at name (slash-separated, relative to
// the root) is in.
func (f fileFilter) match(name string) bool {
	if len(f.include) > 0 && !matchAny(f.include, name) {
		return false
	}
	return !matchAny(f.exclude, name)
}

func matchAny(patterns []string, name string) bool {
	base := path.Base(name)
	for _, p := range patterns {
		subject := base
		if strings.Contains(p, "/") {
			subject = name
		}
		if ok, _ := path.Match(p, subject); ok {
			return true
		}
	}
	return false
}
