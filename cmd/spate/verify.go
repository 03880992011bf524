package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"hash"
	"hash/fnv"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/spate-go/spate/pipeline/filesource"
)

// outputSuffix names the backfill's output files: DST/<split>.out.
const outputSuffix = ".out"

// verifyResult compares a source directory with a backfill's output.
type verifyResult struct {
	InputFiles   int
	InputLines   int64
	InputBytes   int64
	OutputFiles  int
	OutputLines  int64
	Missing      int64    // input lines with no intact output line
	Duplicates   int64    // intact output lines beyond the first for an input line
	Damaged      int64    // output lines whose text differs from the input line they name (torn writes)
	Foreign      int64    // output lines naming no input line
	Malformed    int64    // output lines without a "path:offset<TAB>" key
	MissingLines []string // the first few missing lines' keys
}

// OK reports whether every input line reached the output intact and
// exactly once, and the output holds nothing else.
func (r verifyResult) OK() bool {
	return r.Missing == 0 && r.Duplicates == 0 && r.Damaged == 0 && r.Foreign == 0 && r.Malformed == 0
}

// Complete reports whether every input line reached the output intact,
// duplicates allowed (an at-least-once sink's guarantee).
func (r verifyResult) Complete() bool { return r.Missing == 0 }

// outLine is one output line: the input offset it names and a hash of its
// text.
type outLine struct {
	off  int64
	hash uint64
}

// verifyOutput checks that every line of every file under src appears,
// with the same text, in the output files under dst. An output line is
// "<path>:<offset>\t<line>" (the file sink's format over the file source's
// records): path is the input file relative to src, offset the byte offset
// of the line's first byte. Memory is 16 bytes per output line.
func verifyOutput(ctx context.Context, src filesource.Objects, out *destination) (verifyResult, error) {
	var r verifyResult
	seen := map[string][]outLine{} // input path -> output lines naming it
	err := out.eachOutput(ctx, func(name string, rd io.Reader) error {
		r.OutputFiles++
		return scanOutput(name, rd, seen, &r)
	})
	if err != nil {
		return r, err
	}
	members, err := src.List(ctx)
	if err != nil {
		return r, err
	}
	for _, m := range members {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		r.InputFiles++
		r.InputBytes += m.Size
		got := seen[m.Name]
		delete(seen, m.Name)
		slices.SortFunc(got, func(a, b outLine) int { return cmp.Compare(a.off, b.off) })
		lines, err := inputLines(ctx, src, m.Name)
		if err != nil {
			return r, err
		}
		r.InputLines += int64(len(lines))
		i := 0
		for _, in := range lines {
			for i < len(got) && got[i].off < in.off {
				r.Foreign++ // an offset that starts no line
				i++
			}
			n := 0
			for ; i < len(got) && got[i].off == in.off; i++ {
				if got[i].hash == in.hash {
					n++
				} else {
					r.Damaged++
				}
			}
			if n == 0 {
				r.Missing++
				if len(r.MissingLines) < 5 {
					r.MissingLines = append(r.MissingLines, m.Name+":"+strconv.FormatInt(in.off, 10))
				}
			} else {
				r.Duplicates += int64(n - 1)
			}
		}
		r.Foreign += int64(len(got) - i)
	}
	for _, offs := range seen {
		r.Foreign += int64(len(offs))
	}
	return r, nil
}

func lineHash(b []byte) uint64 {
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}

func scanOutput(path string, f io.Reader, seen map[string][]outLine, r *verifyResult) error {
	ls := newLineStream(f)
	for {
		l, err := ls.next(true)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
		r.OutputLines++
		i := bytes.LastIndexByte(l.head, ':')
		var off int64
		perr := errors.New("no key")
		if l.cut && i > 0 {
			off, perr = strconv.ParseInt(string(l.head[i+1:]), 10, 64)
		}
		if perr != nil {
			r.Malformed++
		} else {
			name := string(l.head[:i])
			seen[name] = append(seen[name], outLine{off: off, hash: l.hash})
		}
	}
}

// inputLines returns every line's first-byte offset and text hash (the
// newline excluded). A line's text is only hashed, never held: memory is
// bounded however long the line.
func inputLines(ctx context.Context, src filesource.Objects, name string) ([]outLine, error) {
	f, _, err := src.Open(ctx, name, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []outLine
	ls := newLineStream(f)
	var off int64
	for {
		l, err := ls.next(false)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, outLine{off: off, hash: l.hash})
		off += l.n
	}
}

// maxKeyBytes bounds an output line's key (the text before its first
// tab): a longer one is malformed.
const maxKeyBytes = 64 << 10

// lineStream reads lines of any length in bounded memory: a line's text
// is hashed as it streams by (FNV-64a, as lineHash), never held whole.
type lineStream struct {
	br *bufio.Reader
	h  hash.Hash64
}

func newLineStream(r io.Reader) *lineStream {
	return &lineStream{br: bufio.NewReaderSize(r, 256<<10), h: fnv.New64a()}
}

// streamedLine is one line of a lineStream.
type streamedLine struct {
	// head, when cut was asked for, is the line's text before its first
	// tab (a copy), and cut says whether the line has a tab and a head of
	// at most maxKeyBytes.
	head []byte
	cut  bool
	// hash is lineHash of the line's text without its newline (with cut:
	// of the text after the first tab).
	hash uint64
	n    int64 // the line's bytes, its newline included
}

// next reads the next line, splitting its head off when cut; io.EOF when
// no line is left.
func (s *lineStream) next(cut bool) (streamedLine, error) {
	var l streamedLine
	s.h.Reset()
	inHead, long := cut, false
	for {
		chunk, err := s.br.ReadSlice('\n')
		l.n += int64(len(chunk))
		end := err == nil // chunk ends with the line's newline
		if end {
			chunk = chunk[:len(chunk)-1]
		}
		if inHead {
			part, rest, found := bytes.Cut(chunk, []byte{'\t'})
			if len(l.head)+len(part) <= maxKeyBytes {
				l.head = append(l.head, part...)
			} else {
				long = true
			}
			chunk = nil
			if found {
				inHead, l.cut, chunk = false, !long, rest
			}
		}
		s.h.Write(chunk)
		switch {
		case end:
			l.hash = s.h.Sum64()
			return l, nil
		case errors.Is(err, bufio.ErrBufferFull):
		case err == io.EOF && l.n > 0:
			l.hash = s.h.Sum64()
			return l, nil
		default:
			return l, err
		}
	}
}

// report renders a verification for people.
func (r verifyResult) report() string {
	var b strings.Builder
	switch {
	case r.OK():
		fmt.Fprintf(&b, "verified exactly once: all %s input lines (%d files, %s) are in the output once", count(r.InputLines), r.InputFiles, bytesStr(r.InputBytes))
	case r.Missing > 0:
		fmt.Fprintf(&b, "VERIFICATION FAILED: %s of %s input lines are missing from the output (first: %s)",
			count(r.Missing), count(r.InputLines), strings.Join(r.MissingLines, ", "))
	case r.Duplicates > 0:
		fmt.Fprintf(&b, "VERIFICATION FAILED: not exactly once: all %s input lines are in the output, %s of them more than once", count(r.InputLines), count(r.Duplicates))
	default:
		fmt.Fprintf(&b, "VERIFICATION FAILED: all %s input lines are in the output once, but it holds other lines too", count(r.InputLines))
	}
	fmt.Fprintf(&b, "; %s output lines in %d files, %s duplicates", count(r.OutputLines), r.OutputFiles, count(r.Duplicates))
	if r.Damaged > 0 {
		fmt.Fprintf(&b, ", %s damaged (torn by a killed writer, each also delivered intact unless counted missing)", count(r.Damaged))
	}
	if r.Foreign > 0 || r.Malformed > 0 {
		fmt.Fprintf(&b, ", %s lines naming no input line, %s malformed", count(r.Foreign), count(r.Malformed))
	}
	return b.String()
}

// verifyExpected checks the output against a record of every line that
// was written to a followed input, whose files may have been renamed,
// truncated or deleted since: each line of expect (its text) must be in
// the output exactly as many times as expect holds it, and the output must
// hold no other line. Memory is 16 bytes per distinct line.
func verifyExpected(ctx context.Context, expect io.Reader, out *destination) (verifyResult, error) {
	r := verifyResult{InputFiles: 1}
	want := map[uint64]int64{}
	ls := newLineStream(expect)
	for {
		l, err := ls.next(false)
		if err == io.EOF {
			break
		}
		if err != nil {
			return r, fmt.Errorf("read --expect: %w", err)
		}
		r.InputLines++
		r.InputBytes += l.n
		want[l.hash]++
	}
	got := map[uint64]int64{}
	err := out.eachOutput(ctx, func(name string, rd io.Reader) error {
		r.OutputFiles++
		ls := newLineStream(rd)
		for {
			l, err := ls.next(true)
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return fmt.Errorf("read %s: %w", name, err)
			}
			r.OutputLines++
			if !l.cut {
				r.Malformed++
			} else {
				got[l.hash]++
			}
		}
	})
	if err != nil {
		return r, err
	}
	for h, n := range want {
		switch g := got[h]; {
		case g < n:
			r.Missing += n - g
		case g > n:
			r.Duplicates += g - n
		}
		delete(got, h)
	}
	for _, n := range got {
		r.Foreign += n
	}
	if r.Missing > 0 {
		r.MissingLines = []string{"(lines of --expect; keys are not compared)"}
	}
	return r, nil
}

func runVerify(args []string) int {
	fs := newFlagSet("verify", "--src DIR|URL --dst DIR|URL | --expect FILE --dst DIR|URL",
		"Checks that every line of every file under --src is in the output files (*.out) under --dst\n(a directory, or a bucket URL such as s3://bucket?region=…) exactly once. Exits 0 only if no line is missing, none is there twice, and the output holds\nnothing else (with --allow-duplicates: only if no line is missing).\n\nWith --expect, the output is checked against FILE, a record of every line written to a\nfollowed input (spate backfill --follow), whose files may since have been renamed,\ntruncated or deleted: each line of FILE must be in the output as often as FILE has it,\nand nothing else.\n\nA table (--src postgres://…?table=T, as given to spate backfill, with its key, columns, filter\nand chunk_rows): into a table (--dst postgres://…?table=T2), the row count and a checksum of\nthe rows of every chunk of the key (the chunks the job's plan cuts) are compared, and each\nchunk that differs is named with its key range; into a directory or bucket, every row of\nthe table must be in the output once, as the table holds it now.")
	src := fs.String("src", "", "the backfill's source: a directory, a bucket URL, or a postgres:// table URL")
	expect := fs.String("expect", "", "instead of --src: a file holding every line that was written to the input, one per line")
	dst := fs.String("dst", "", "the backfill's output directory, bucket URL, or postgres:// table URL")
	allowDups := fs.Bool("allow-duplicates", false, "accept duplicates (the output of an at-least-once sink): fail only on a missing line")
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if err := checkFlags(
		func() error { return noPositional(pos) },
		func() error {
			if *expect != "" {
				if *src != "" {
					return flagErrorf("--src and --expect: give one (the input, or a record of what was written to it)")
				}
				return nil
			}
			return required("src", *src, "the backfill's source directory (or bucket URL)")
		},
		func() error { return required("dst", *dst, "the backfill's output directory") },
	); err != nil {
		return usageError(fs, "%v", err)
	}
	if *expect != "" {
		return verifyAgainst(*expect, *dst, *allowDups)
	}
	in, err := openInput(context.Background(), *src)
	if err != nil {
		return usageError(fs, "--src %s: %v", argShown(*src), err)
	}
	if in.table != nil {
		return verifyTableCmd(fs, in, *dst, *allowDups)
	}
	defer in.close()
	out, err := openOutput(context.Background(), *dst)
	if err != nil {
		return usageError(fs, "--dst %s: %v", *dst, err)
	}
	defer out.close()
	r, err := verifyOutput(context.Background(), in.objs, out)
	if err != nil {
		return fail(exitFailed, "verify: %v", err)
	}
	fmt.Println(r.report())
	if *allowDups && r.Complete() {
		return exitOK
	}
	if !r.OK() {
		return exitFailed
	}
	return exitOK
}

// verifyAgainst is spate verify --expect.
func verifyAgainst(expect, dst string, allowDups bool) int {
	f, err := os.Open(expect)
	if err != nil {
		return fail(exitUsage, "--expect: %v", err)
	}
	defer f.Close()
	out, err := openOutput(context.Background(), dst)
	if err != nil {
		return fail(exitUsage, "--dst %s: %v", dst, err)
	}
	defer out.close()
	r, err := verifyExpected(context.Background(), f, out)
	if err != nil {
		return fail(exitFailed, "verify: %v", err)
	}
	fmt.Println(r.report())
	if allowDups && r.Complete() {
		return exitOK
	}
	if !r.OK() {
		return exitFailed
	}
	return exitOK
}

// verifyTableCmd is spate verify of a table --src.
func verifyTableCmd(fs *flag.FlagSet, in *input, dst string, allowDups bool) int {
	out, err := openOutput(context.Background(), dst)
	if err != nil {
		return usageError(fs, "--dst %s: %v", argShown(dst), err)
	}
	defer out.close()
	r, err := verifyTable(context.Background(), in.table, out)
	if err != nil {
		return fail(exitFailed, "verify: %v", err)
	}
	fmt.Println(r.report())
	if lr, ok := r.(*tableLinesResult); ok && allowDups && lr.missing == 0 && lr.damaged == 0 {
		return exitOK
	}
	if !r.OK() {
		return exitFailed
	}
	return exitOK
}
