// Package filesource is a coordinated, line-oriented backfill of a set of
// objects — the files of a directory ([Dir]) or the objects of a bucket
// (package blobsource adapts any Go CDK bucket: S3, GCS, Azure, local): the
// planner packs the objects into weighted splits, every split is leased by
// one pipeline instance at a time, and a split's lane reads its objects'
// lines in order.
//
// # Splits
//
// The planner lists the input (for a directory: recursively, regular files
// only; a FIFO, socket or device is never opened, and is named once in a
// warning) in byte order of the objects' slash-separated names, and packs
// consecutive objects into splits of at most the target and MaxFiles
// members. An object larger than the target is divided into byte ranges
// (see Ranges). The target is TargetBytes, lowered so that the input makes
// at least MinSplits splits (16 by default: enough to keep a fleet busy)
// but never below 64 KiB a split (see [PlannerOptions] MinSplits), so the
// plan stays bounded: at most about twice MinSplits splits beyond what
// TargetBytes and MaxFiles alone make. A split's weight is its byte count.
// Its id is "f1" followed by the base64url encoding of the first 16 bytes
// of a SHA-256 over the packing version and every member's name, size and
// modification time (and a range's bounds): the same objects always make
// the same splits, an overwritten object becomes new work, and a packing
// change orphans old progress on purpose. The plan is final: objects added
// later are not seen, unless the job follows its input (see Following).
//
// # Ranges
//
// An object larger than the target becomes k = ceil(size/target) splits
// of equal byte ranges [start, end) of it, each with a descriptor of
// version 2 naming the object and its range (an older build refuses it as
// a version it does not know, rather than reading the whole object). A
// range owns the lines that start inside it: its lane skips to the first
// line start at or after its start (a range that begins at 0, or just
// after a newline, starts with a line) and reads through the line that
// crosses its end. So every line of the object is read by exactly one
// range, whatever the line lengths; a range in which no line starts reads
// nothing and completes. Offsets are relative to the range's start; keys
// are the object's own byte offsets, as for a whole object.
//
// # Division
//
// A running split can be divided by its owner (the leader asks when the
// fleet idles: [pipeline.DivisionProposer], [pipeline.SplitDivider]): at
// a byte offset at or beyond what its lane has read, about the middle of
// the rest, the split keeps the lines that start before it and gives up
// the others to a child, by the ranges' rule. Both halves are range
// descriptors (version 2); a divided packed split's range runs over
// several members, its offsets those of the members concatenated. A
// followed file is never divided, nor a split with less than
// [MinDivideBytes] left. Each commit reports the bytes left
// (SplitProgress.Remaining).
//
// # Offsets and watermarks
//
// A split's bytes are its members' bytes concatenated in descriptor order;
// offsets are split-relative. Every record is one line; its offset is the
// split-relative offset of the line's last byte (its newline, or the file's
// last byte when the file does not end in one), so the committed watermark
// (last acknowledged offset plus one) is exactly where the next line
// starts. A resumed split seeks there: it never re-emits a committed line
// and never skips an uncommitted one. Each line is read up to the size the
// planner saw; bytes appended later are not part of the split.
//
// # Records
//
// A record's value is the line without its newline; its key is
// "<relative path>:<byte offset of the line's first byte in its file>",
// which identifies every input line for a verifier. The path is the
// file's name byte for byte: a name that is not valid UTF-8 is carried in
// its split descriptor as "name_b64", base64 of its bytes (see [Member]),
// and shown Go-quoted in messages.
//
// # Line cap
//
// A lane holds a whole line in memory. A line longer than the line cap
// ([DefaultMaxLineBytes], 1 MiB; [Source.WithMaxLineBytes], or
// [PlannerOptions] MaxLineBytes for [New]) fails its split with an error
// naming the file and the line's byte offset, after the lines before it;
// the rest of the job goes on. So a lane's memory is bounded, at about
// twice the cap.
//
// # Drift and read errors
//
// A member that is missing, or smaller than planned, makes the split
// poison: it is failed through the coordinator (an attempt is consumed)
// and quarantined after the attempt cap. Resume progress whose watermark is
// not on a line boundary of the split, or whose file is now smaller than
// planned or gone, is rejected the same way, naming the file and its
// sizes; the pipeline goes on with the rest of the job. Any other
// failed open or read (a dropped connection to a bucket) is retried from the
// start of the line being read, up to a few times in a row, before the split
// is reported poison; a line cut short by a failed read is never emitted.
//
// # Following
//
// With [PlannerOptions] Follow the job is continuous. Its plan stays Open,
// and the leader lists the input again at every replan. Each file of a
// local directory ([LocalDir]) becomes a tail split of its own, named by
// the file's identity ([FileID]: device, inode and birth time), not its
// path. An object of a bucket, which cannot grow, becomes a bounded split
// of its own, so a new object is new work and nothing else is. Only what
// is new is written to the store at a replan, and the cursor is a few
// bytes: a digest of the listing and when it last changed.
//
// A tail split's lane reads its file's whole lines and, at the file's end,
// waits for more: it looks every 50ms. A last line without its newline
// waits for it. The split's watermark and key offsets go on as the file
// grows, and its output follows within about a commit interval. What
// happens to a followed file is defined, and logged with its name:
//
//   - Renamed (a rotation: rename, then a new file at the path): the lane
//     keeps reading the renamed file, which keeps its split; a new owner
//     finds it by its identity. The new file at the path is new work,
//     discovered at the next replan.
//   - Truncated (copy-truncate): the lane reads the file again from its
//     start; the split's offsets go on from where they were (the file's
//     base offset rides in the progress state, and a key names it:
//     "name~base:offset"). Lines written after the lane's last read and
//     before the truncation cannot be read by anyone; the log says so
//     (a warning naming the bytes where the lane knew of them). A copy
//     left in the input is not followed by default (see below).
//   - Deleted: the lane reads what the open file still holds and the
//     split completes; a file deleted while no worker held its split
//     completes at its last commit.
//
// # What is followed
//
// A following plan takes the files that match an Include pattern (all
// when there is none) and no Exclude pattern; with no Exclude,
// [DefaultFollowExcludes] leave out what a log rotation leaves beside a
// live log (numbered and dated copies, compressed archives). A file whose
// first bytes are a compressed format's magic or hold a NUL byte is
// refused, named once in a warning, and never shipped as lines; a lane
// checks a file that was empty when planned when its first bytes come. A
// followed file that has been idle for ReleaseAfter parks: its split stays
// its lane's, but takes none of the worker's lanes
// ([spate.SplitProgress] Parked), and new bytes are read on from where it
// stopped; one renamed away (or left out by the patterns) is first read to
// its end, its last line without a newline too. New files are listed within moments of their creation
// where the platform reports it (fsnotify), when a lane sees its file
// renamed, and every Discover ([spate.PlanTrigger]).
//
// The job ends when the plan turns Final: with UntilIdle, at the first
// replan that finds the input unchanged for that long. The coordinator
// then reports [spate.PlanFinalized], and each tail lane completes at the
// end of its file (its last line emitted even without a newline).
package filesource

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spate-go/spate"
)

// PackingVersion is folded into every split id; changing how files are
// packed must change it.
const PackingVersion = 1

// RangeVersion is the descriptor version of a split that is a byte range
// of one object (see the package documentation, "Ranges"); it is folded
// into the range's id.
const RangeVersion = 2

// DefaultMinSplits is the fewest splits a bounded plan aims at (see
// [PlannerOptions] MinSplits).
const DefaultMinSplits = 16

// MinSplitBytes is the smallest target the MinSplits rule lowers the
// target to: an input below MinSplits × 64 KiB makes fewer splits.
const MinSplitBytes = 64 << 10

// Member is one file of a split, as the planner saw it.
//
// Its name is any bytes a file system allows. In a descriptor (JSON) a
// name that is valid UTF-8 is the string "name"; one that is not, which a
// JSON string cannot hold byte for byte, is "name_b64", the standard
// base64 of its bytes, and "name" is left out. So a name round-trips
// exactly through a plan, and a descriptor of valid names is what it
// always was. (A build older than this encoding refuses such a descriptor
// as bad rather than reading another file.)
type Member struct {
	Name  string `json:"name"`  // slash-separated path relative to the root
	Size  int64  `json:"size"`  // bytes the split covers
	MTime int64  `json:"mtime"` // modification time, Unix nanoseconds
}

// memberJSON is a Member's descriptor form (see [Member]).
type memberJSON struct {
	descName
	Size  int64 `json:"size"`
	MTime int64 `json:"mtime"`
}

// MarshalJSON encodes the name losslessly (see [Member]).
func (m Member) MarshalJSON() ([]byte, error) {
	return json.Marshal(memberJSON{descName: encodeName(m.Name), Size: m.Size, MTime: m.MTime})
}

// UnmarshalJSON decodes what MarshalJSON encodes.
func (m *Member) UnmarshalJSON(b []byte) error {
	var j memberJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	name, err := j.decode()
	if err != nil {
		return err
	}
	*m = Member{Name: name, Size: j.Size, MTime: j.MTime}
	return nil
}

// descName is a name's descriptor fields: name when it is valid UTF-8,
// else name_b64 (its bytes, base64).
type descName struct {
	Name    string `json:"name,omitempty"`
	NameB64 string `json:"name_b64,omitempty"`
}

// encodeName is name's descriptor fields.
func encodeName(name string) descName {
	if utf8.ValidString(name) {
		return descName{Name: name}
	}
	return descName{NameB64: base64.StdEncoding.EncodeToString([]byte(name))}
}

// decode is encodeName's inverse.
func (d descName) decode() (string, error) {
	if d.NameB64 == "" {
		return d.Name, nil
	}
	if d.Name != "" {
		return "", fmt.Errorf("both name %q and name_b64 %q", d.Name, d.NameB64)
	}
	raw, err := base64.StdEncoding.Strict().DecodeString(d.NameB64)
	if err != nil {
		return "", fmt.Errorf("name_b64 %q: %w", d.NameB64, err)
	}
	return string(raw), nil
}

// quoteName is a file name for a message: as it is when it is valid,
// printable UTF-8, else Go-quoted (so "bad-\xff.log" shows its bytes).
func quoteName(name string) string {
	if utf8.ValidString(name) && strings.IndexFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) < 0 {
		return name
	}
	return strconv.Quote(name)
}

// Descriptor is a split's payload: its members in read order, or, for a
// followed file's split, the file.
type Descriptor struct {
	Version int      `json:"v"`
	Files   []Member `json:"files"`
	// Tail is the followed file of a tail split (see [PlannerOptions]
	// Follow); Files is empty then.
	Tail *Tail `json:"tail,omitempty"`
	// Range is the part of its one member a range split reads (Version
	// is RangeVersion then; see the package documentation, "Ranges").
	Range *Range `json:"range,omitempty"`
}

// Range is a byte range [Start, End) of a member: the split owns the
// lines that start inside it.
type Range struct {
	Start int64 `json:"start"`
	End   int64 `json:"end"`
}

// Total is the split's size in bytes: for a range, its length (its last
// line may reach beyond it).
func (d Descriptor) Total() int64 {
	if d.Range != nil {
		return d.Range.End - d.Range.Start
	}
	var n int64
	for _, f := range d.Files {
		n += f.Size
	}
	return n
}

// DecodeDescriptor parses a split descriptor strictly.
func DecodeDescriptor(b []byte) (Descriptor, error) {
	var d Descriptor
	if err := json.Unmarshal(b, &d); err != nil {
		return d, spate.Fatalf("filesource: bad descriptor: %v", err)
	}
	switch {
	case d.Version == RangeVersion && d.Range == nil:
		return d, spate.Fatalf("filesource: bad descriptor: version %d without a range", d.Version)
	case d.Version == RangeVersion:
		var size int64
		for _, f := range d.Files {
			size += f.Size
		}
		if len(d.Files) == 0 || d.Range.Start < 0 || d.Range.Start >= d.Range.End || d.Range.End > size {
			return d, spate.Fatalf("filesource: bad descriptor: range [%d, %d) of %d members of %d bytes (the range must lie inside them)", d.Range.Start, d.Range.End, len(d.Files), size)
		}
	case d.Version != PackingVersion:
		return d, spate.Fatalf("filesource: descriptor version %d, want %d or %d", d.Version, PackingVersion, RangeVersion)
	case d.Range != nil:
		return d, spate.Fatalf("filesource: bad descriptor: version %d with a range", d.Version)
	}
	for i, m := range d.Files {
		if m.Name == "" || m.Size < 0 {
			return d, spate.Fatalf("filesource: bad descriptor: member %d has name %q and size %d", i, m.Name, m.Size)
		}
	}
	if d.Tail != nil && (len(d.Files) > 0 || d.Tail.Name == "") {
		return d, spate.Fatalf("filesource: bad descriptor: a tail split names the file %q and %d members", d.Tail.Name, len(d.Files))
	}
	return d, nil
}

// PlannerOptions tune the packing. A zero field takes its default.
type PlannerOptions struct {
	// TargetBytes is a split's byte budget. Default 64 MiB.
	TargetBytes int64
	// MaxFiles caps a split's members (it keeps descriptors small).
	// Default 16.
	MaxFiles int
	// MinSplits is the fewest splits a bounded plan aims at, so that a
	// fleet of workers has work for each of them: when the input's bytes
	// divided by MinSplits are below TargetBytes, that quotient is the
	// target (but not below [MinSplitBytes], 64 KiB). Default
	// [DefaultMinSplits] (16); 1 turns the rule off. Part of the job's
	// identity. Unused with Follow.
	MinSplits int
	// Follow makes the job continuous: the plan stays Open, every replan
	// discovers the input's new files, and each file of a local directory
	// is followed as it grows, by a tail split of its own (see the package
	// documentation, "Following"). An object of a bucket, which cannot
	// grow, is a bounded split of its own. Part of the job's identity.
	Follow bool
	// UntilIdle, with Follow, turns the plan Final at the first replan
	// that finds the input unchanged (no new file, no file grown or
	// shrunk) for at least this long; the job then completes. 0: the job
	// runs until it is stopped.
	UntilIdle time.Duration
	// Now is the clock of UntilIdle (default time.Now).
	Now func() time.Time
	// MaxLineBytes is the line cap of the source [New] builds (see
	// [Source.WithMaxLineBytes]): a longer line fails its split with an
	// error naming the file and the line's offset. Default
	// [DefaultMaxLineBytes] (1 MiB). Not part of the job's identity; the
	// planner does not use it.
	MaxLineBytes int

	// Include and Exclude choose the files of the input that are planned
	// (see "What is followed" in the package documentation): a file is
	// planned when it matches an Include pattern (or Include is empty)
	// and no Exclude pattern. A pattern is a path.Match glob on the
	// file's base name, or, when it holds a slash, on its path relative
	// to the root. With Follow and an empty Exclude,
	// [DefaultFollowExcludes] apply, unless NoDefaultExcludes. Not part
	// of the job's identity: the leader's patterns decide.
	Include, Exclude  []string
	NoDefaultExcludes bool
	// ReleaseAfter, with Follow, is how long a followed file must have
	// been idle (not grown) before its split parks at the file's end: it
	// keeps its split and reader but frees the worker's lane for a split
	// that waits for one, and takes it back when the file grows. A file
	// renamed away (or no longer matching the patterns) is first read to
	// its end, its last line without a newline too. A parked split
	// completes when its file is deleted or the plan turns final. Default
	// [DefaultReleaseAfter]; negative: never.
	ReleaseAfter time.Duration
	// Discover, with Follow, is how often the planner lists the input for
	// new files on its own, beside the leader's replan interval (which
	// cannot be shorter than the lease) and the file-system events it
	// watches where the platform has them. 0: only those.
	Discover time.Duration
	// Retain, with Follow, is how long the split of a followed file that
	// is gone (deleted, or moved out of the input) is kept in the store
	// after it completed: then the leader prunes it, so a job whose logs
	// rotate for a year holds its live files and this window. A file that
	// comes back after the split was pruned (moved out and back) is new
	// work. Default [DefaultRetain]; negative: never pruned.
	Retain time.Duration
	// Logger is where the planner names the files it refuses (not text).
	// Default slog.Default().
	Logger *slog.Logger
}

// Planner enumerates an input's objects into splits. It implements
// [spate.SplitPlanner].
type Planner struct {
	objs   Objects
	opts   PlannerOptions
	follow *followState // Include/Exclude, and what a following plan saw
}

// NewPlanner plans the objects of objs (for a directory, [Dir]).
func NewPlanner(objs Objects, opts PlannerOptions) *Planner {
	if opts.TargetBytes <= 0 {
		opts.TargetBytes = 64 << 20
	}
	if opts.MaxFiles <= 0 {
		opts.MaxFiles = 16
	}
	if opts.MinSplits <= 0 {
		opts.MinSplits = DefaultMinSplits
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Planner{objs: objs, opts: opts, follow: newFollowState(opts)}
}

// Fingerprint derives the job identity from the configuration only: the
// input's location and the packing options.
func (p *Planner) Fingerprint() string {
	if p.opts.Follow {
		return "filesource:v" + strconv.Itoa(PackingVersion) + ":" + p.objs.Location() + ":follow"
	}
	fp := "filesource:v" + strconv.Itoa(PackingVersion) + ":" + p.objs.Location() +
		":target=" + strconv.FormatInt(p.opts.TargetBytes, 10) + ":files=" + strconv.Itoa(p.opts.MaxFiles)
	if p.opts.MinSplits != DefaultMinSplits {
		// Named only when it is not the default, so that a job planned by
		// an earlier build (whose stored plan is kept) keeps its identity.
		fp += ":min=" + strconv.Itoa(p.opts.MinSplits)
	}
	return fp
}

// Plan lists the input and packs it. The plan is final, unless Follow.
func (p *Planner) Plan(ctx context.Context, pc spate.PlanContext) (spate.SplitPlan, error) {
	members, err := p.objs.List(ctx)
	if err != nil {
		return spate.SplitPlan{}, err
	}
	if p.opts.Follow {
		return p.planFollow(members, pc)
	}
	if members, err = p.follow.selected(members); err != nil {
		return spate.SplitPlan{}, err
	}
	specs, err := PlanSplits(members, p.opts.TargetBytes, p.opts.MaxFiles, p.opts.MinSplits)
	if err != nil {
		return spate.SplitPlan{}, err
	}
	splits := make([]spate.PlannedSplit, len(specs))
	for i, spec := range specs {
		splits[i] = spate.NewPlannedSplit(spec)
	}
	return spate.NewSplitPlan(splits, spate.PlanFinal), nil
}

// Target is the byte budget of a split of an input of total bytes: target,
// lowered to total/minSplits (rounded up) but not below [MinSplitBytes].
func Target(total, target int64, minSplits int) int64 {
	if minSplits > 1 {
		share := total/int64(minSplits) + min(total%int64(minSplits), 1)
		target = min(target, max(share, MinSplitBytes))
	}
	return max(target, 1)
}

// PlanSplits is a bounded plan's splits of members (in order): packed by
// [Pack] at the [Target] for their total, and each member larger than the
// target divided into ranges by [Ranges].
func PlanSplits(members []Member, target int64, maxFiles, minSplits int) ([]spate.SplitSpec, error) {
	var total int64
	for _, m := range members {
		total += m.Size
	}
	target = Target(total, target, minSplits)
	var specs []spate.SplitSpec
	for _, group := range Pack(members, target, maxFiles) {
		if len(group) == 1 && group[0].Size > target {
			for _, r := range Ranges(group[0].Size, target) {
				spec, err := RangeSplitFor(group[0], r)
				if err != nil {
					return nil, err
				}
				specs = append(specs, spec)
			}
			continue
		}
		spec, err := SplitFor(group)
		if err != nil {
			return nil, err
		}
		specs = append(specs, spec)
	}
	return specs, nil
}

// Ranges divides size bytes into ceil(size/target) ranges of equal length
// (to a byte), in order.
func Ranges(size, target int64) []Range {
	if size <= 0 {
		return nil
	}
	k := size/target + min(size%target, 1)
	out := make([]Range, k)
	q, r := size/k, size%k
	bound := func(i int64) int64 { return q*i + r*i/k } // size*i/k without overflow (r*i < k*k)
	for i := range k {
		out[i] = Range{Start: bound(i), End: bound(i + 1)}
	}
	return out
}

// RangeSplitID derives the deterministic id of the range r of m.
func RangeSplitID(m Member, r Range) spate.SplitID {
	h := sha256.New()
	var buf [8]byte
	for _, v := range []int64{RangeVersion, int64(len(m.Name))} {
		binary.BigEndian.PutUint64(buf[:], uint64(v))
		h.Write(buf[:])
	}
	h.Write([]byte(m.Name))
	for _, v := range []int64{m.Size, m.MTime, r.Start, r.End} {
		binary.BigEndian.PutUint64(buf[:], uint64(v))
		h.Write(buf[:])
	}
	sum := h.Sum(nil)
	return spate.MustSplitID("f1" + base64.RawURLEncoding.EncodeToString(sum[:16]))
}

// RangeSplitFor builds the split spec of the range r of m.
func RangeSplitFor(m Member, r Range) (spate.SplitSpec, error) {
	desc, err := json.Marshal(Descriptor{Version: RangeVersion, Files: []Member{m}, Range: &r})
	if err != nil {
		return spate.SplitSpec{}, fmt.Errorf("filesource: encode descriptor: %w", err)
	}
	return spate.NewSplitSpec(RangeSplitID(m, r), desc).WithWeight(uint64(max(r.End-r.Start, 1))), nil
}

// Pack groups consecutive members into splits of at most target bytes
// (a bigger file alone) and maxFiles members.
func Pack(members []Member, target int64, maxFiles int) [][]Member {
	var out [][]Member
	var cur []Member
	var bytes int64
	for _, m := range members {
		if len(cur) > 0 && (bytes+m.Size > target || len(cur) >= maxFiles) {
			out = append(out, cur)
			cur, bytes = nil, 0
		}
		cur = append(cur, m)
		bytes += m.Size
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// SplitID derives a split's deterministic id from its members.
func SplitID(members []Member) spate.SplitID {
	h := sha256.New()
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], PackingVersion)
	h.Write(buf[:])
	sorted := slices.Clone(members)
	slices.SortFunc(sorted, func(a, b Member) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	for _, m := range sorted {
		binary.BigEndian.PutUint64(buf[:], uint64(len(m.Name)))
		h.Write(buf[:])
		h.Write([]byte(m.Name))
		binary.BigEndian.PutUint64(buf[:], uint64(m.Size))
		h.Write(buf[:])
		binary.BigEndian.PutUint64(buf[:], uint64(m.MTime))
		h.Write(buf[:])
	}
	sum := h.Sum(nil)
	return spate.MustSplitID("f1" + base64.RawURLEncoding.EncodeToString(sum[:16]))
}

// SplitFor builds the split spec of a member group.
func SplitFor(members []Member) (spate.SplitSpec, error) {
	desc, err := json.Marshal(Descriptor{Version: PackingVersion, Files: members})
	if err != nil {
		return spate.SplitSpec{}, fmt.Errorf("filesource: encode descriptor: %w", err)
	}
	var total int64
	for _, m := range members {
		total += m.Size
	}
	return spate.NewSplitSpec(SplitID(members), desc).WithWeight(uint64(max(total, 1))), nil
}
