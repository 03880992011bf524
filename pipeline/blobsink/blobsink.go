// Package blobsink is the exactly-once object-store sink: a
// [pipeline.StagingSink] over a [gocloud.dev/blob] bucket (S3, Google Cloud
// Storage, Azure Blob Storage, a local directory through fileblob, memory).
//
// Open the bucket with the driver you need linked in:
//
//	import _ "gocloud.dev/blob/s3blob"
//
//	b, err := blob.OpenBucket(ctx, "s3://my-bucket?region=eu-west-1&prefix=out/")
//	sink, err := blobsink.New(ctx, b, "s3://my-bucket/out/", "my-job")
//
// # Layout
//
// A split's output is a sequence of immutable objects, its parts:
//
//	<split>/00000000.out, <split>/00000001.out, ...
//
// Reading a split's parts in name order gives its output in order, each
// record once. Staged objects live under .spate/stage/<split>/<epoch>/ and
// the job marker is .spate/job; readers ignore .spate/.
//
// # How a part becomes visible
//
// Records are staged in memory. At a commit, once the staged bytes reach
// [Sink.RollSize] or the oldest of them is [Sink.RollInterval] old (or the
// split completes or is handed back), they are uploaded as one staged
// object, and the committable lists it; the commit covers the records up
// to there (a commit that cuts no part commits nothing). Only after that
// commit won is the staged object copied to the part's name. A part is
// never rewritten with other bytes: its name is fixed by its index, which
// the committed record fixes, so a publish repeated (a retry, a new owner
// finishing a crashed one's publish, a zombie waking up) writes the same
// bytes to the same name. A zombie (frozen past its lease) can upload
// staged objects, but its commits are fenced, so none is ever listed or
// copied.
//
// Objects per split: about its size over RollSize plus its run time over
// RollInterval. Each part is written as one object by the bucket's own
// writer, which uploads a part larger than its buffer in a multipart
// upload and respects the store's limits (S3: parts of 5 MiB to 5 GiB, at
// most 10,000); a part is at most RollSize plus one commit's records.
//
// # Damage
//
// Publish first checks that the parts published before are still there
// at their committed sizes. A part deleted or replaced under the job, or
// the staged object a publish must copy deleted (unless the part is
// already there with the committed bytes: a new owner published it), is
// an error marked [pipeline.ErrOutputDamaged], naming the key and the fix:
// no retry can mend it, and the coordination driver sets the split aside.
// Any other error of the bucket leaves the publish to be retried.
//
// # Faults of the bucket
//
// An error of the bucket that passes (a network error, a 5xx answer,
// throttling, the deadline of one call) is marked [spate.ErrRetryable]:
// the coordination driver keeps the split and tries its stage again,
// backing off, and a failed publish is retried. One that no retry mends
// (access denied, a missing bucket, an unsupported or invalid request) is
// marked [spate.ErrFatal] and says what to fix: a stage that cannot open
// sets its split aside, and a part that cannot be staged stops the
// pipeline. An error of neither kind is left unmarked.
//
// # Cleaning up
//
// A new owner deletes the staged objects of its split once it has
// published what the committed record lists; a completed split's staged
// objects are deleted at once, and [RemoveStaging] removes what is left
// once the job completed. A staged object can still be left behind by a
// zombie that uploads after the job ended: give the bucket a lifecycle
// rule expiring objects under the prefix .spate/stage/ after a day (S3:
// an Expiration rule with that prefix filter; GCS: a Delete rule with
// matchesPrefix).
package blobsink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
)

const (
	metaPrefix  = ".spate/"
	jobKey      = metaPrefix + "job"
	stagePrefix = metaPrefix + "stage/"
	partSuffix  = ".out"

	// DefaultRollSize is the staged bytes that make a part.
	DefaultRollSize = 8 << 20
	// DefaultRollInterval is the age of the oldest staged byte that makes
	// a part however few bytes are staged.
	DefaultRollInterval = 10 * time.Second
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Sink writes each split's output to parts in a bucket, exactly once.
// Set its fields before the first write.
type Sink struct {
	// Format renders one record onto buf (default: key, tab, value,
	// newline).
	Format func(buf []byte, r pipeline.Record) []byte
	// RollSize and RollInterval decide when staged bytes become a part
	// (see the package documentation). Zero means the default.
	RollSize     int64
	RollInterval time.Duration

	b        *blob.Bucket
	location string
	now      func() time.Time

	mu      sync.Mutex
	stages  map[pipeline.PartitionID]*stage
	retired map[pipeline.PartitionID]bool
}

// stage is one tenancy of one split.
type stage struct {
	mu     sync.Mutex
	split  spate.SplitID
	epoch  spate.LeaseEpoch
	closed bool

	buf     []byte         // staged bytes of records not in a part yet
	marks   []mark         // per staged record: its offset and the end of its bytes in buf
	oldest  time.Time      // when buf got its first byte
	parts   int            // parts committed or prepared (the next part's index)
	bytes   int64          // bytes in those parts
	pending []part         // prepared parts not known published
	upload  map[int][]byte // bytes of this tenancy's pending parts, for Publish
	covered int64          // the watermark the prepared parts cover
}

type mark struct{ off, end int64 }

// part is one listed part: its index, the staged object holding it, its
// length and CRC-32C.
type part struct {
	I     int    `json:"i"`
	Stage string `json:"s"`
	Len   int64  `json:"n"`
	CRC   uint32 `json:"c"`
}

// commit is the committable: how many parts and bytes the split's
// output has, and the parts not known published.
type commit struct {
	V       int    `json:"v"`
	Parts   int    `json:"parts"`
	Bytes   int64  `json:"bytes"`
	Pending []part `json:"pending,omitempty"`
}

// New returns a sink writing the output of job into b. location names the
// bucket in errors and logs (a URL without secrets). The bucket must hold
// no other job's output: its marker .spate/job names the job that owns
// it, and a different job is refused. An empty job skips the marker.
func New(ctx context.Context, b *blob.Bucket, location, job string) (*Sink, error) {
	s := &Sink{b: b, location: location, now: time.Now, stages: map[pipeline.PartitionID]*stage{}, retired: map[pipeline.PartitionID]bool{}}
	if job != "" {
		if err := s.claim(ctx, job); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *Sink) claim(ctx context.Context, job string) error {
	got, err := s.b.ReadAll(ctx, jobKey)
	switch {
	case err == nil:
		return s.checkMarker(got, job)
	case gcerrors.Code(err) != gcerrors.NotFound:
		return fmt.Errorf("blob sink: cannot read the destination's job marker %s%s: %w (is the bucket reachable and readable?)", s.location, jobKey, fault(err))
	}
	// Absent: create it if still absent (a store without conditional
	// writes ignores the condition; the read above is then the check).
	err = s.b.WriteAll(ctx, jobKey, []byte(job+"\n"), &blob.WriterOptions{IfNotExist: true, ContentType: "text/plain"})
	if err == nil {
		return nil
	}
	if code := gcerrors.Code(err); code == gcerrors.FailedPrecondition || code == gcerrors.AlreadyExists {
		if got, rerr := s.b.ReadAll(ctx, jobKey); rerr == nil {
			return s.checkMarker(got, job) // another worker of the job (or another job) wrote it first
		}
	}
	return fmt.Errorf("blob sink: cannot write the destination's job marker %s%s: %w (is the bucket writable?)", s.location, jobKey, fault(err))
}

func (s *Sink) checkMarker(got []byte, job string) error {
	if !bytes.Equal(got, []byte(job+"\n")) {
		return fmt.Errorf("blob sink: the destination %s holds the output of job %q (its marker %s%s), not of job %q: give each job its own destination, or delete that job's output first",
			s.location, string(bytes.TrimSpace(got)), s.location, jobKey, job)
	}
	return nil
}

// PartKey is the key of a split's part i.
func PartKey(split spate.SplitID, i int) string {
	return split.String() + "/" + fmt.Sprintf("%08d", i) + partSuffix
}

// Destination implements [pipeline.SinkDestination].
func (s *Sink) Destination() string { return s.location }

// The runtime finds these capabilities by type assertion: a drifted method
// would switch one off without a compile error, so the build checks them.
var (
	_ pipeline.StagingSink     = (*Sink)(nil)
	_ pipeline.ChunkedSink     = (*Sink)(nil)
	_ pipeline.SinkDestination = (*Sink)(nil)
)

func (s *Sink) rollSize() int64 {
	if s.RollSize > 0 {
		return s.RollSize
	}
	return DefaultRollSize
}

func (s *Sink) rollInterval() time.Duration {
	if s.RollInterval > 0 {
		return s.RollInterval
	}
	return DefaultRollInterval
}

// OpenStage implements [pipeline.StagingSink]: it publishes what the
// committed record lists, checks the split's parts against it and deletes
// the split's staged objects.
func (s *Sink) OpenStage(ctx context.Context, t pipeline.StageTenancy, committed []byte) error {
	st := &stage{split: t.Split, epoch: t.Epoch, upload: map[int][]byte{}}
	var c commit
	if committed != nil {
		var err error
		if c, err = decodeCommit(committed); err != nil {
			return err
		}
		st.parts, st.bytes = c.Parts, c.Bytes
	}
	// Check before writing anything: a damaged split is refused as found.
	if err := s.checkParts(ctx, st, c.Pending, true); err != nil {
		return err
	}
	for _, p := range c.Pending {
		if err := s.publishFromStage(ctx, st.split, p); err != nil {
			return err
		}
	}
	if err := s.deletePrefix(ctx, stagePrefix+st.split.String()+"/"); err != nil {
		return fmt.Errorf("blob sink: cannot discard the unlisted staged objects of split %s under %s%s%s/: %w", st.split, s.location, stagePrefix, st.split, fault(err))
	}
	s.mu.Lock()
	s.stages[t.Partition] = st
	delete(s.retired, t.Partition)
	s.mu.Unlock()
	return nil
}

// checkParts lists the split's parts: exactly the committed ones (a
// pending part may still be missing), of the committed sizes in total.
// Unless strict, parts past the committed ones are let be (a newer owner's,
// or strays that the next OpenStage refuses). The damage it finds is
// marked [pipeline.ErrOutputDamaged]; a failed listing is not.
func (s *Sink) checkParts(ctx context.Context, st *stage, pending []part, strict bool) error {
	prefix := st.split.String() + "/"
	unpublished := map[int]int64{}
	var want int64 = st.bytes
	for _, p := range pending {
		unpublished[p.I] = p.Len
		want -= p.Len
	}
	it := s.b.List(&blob.ListOptions{Prefix: prefix})
	var n int
	var total int64
	seen := map[int]bool{}
	for {
		obj, err := it.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("blob sink: cannot list the parts of split %s under %s%s: %w", st.split, s.location, prefix, fault(err))
		}
		if obj.IsDir {
			continue
		}
		i, ok := partIndex(st.split, obj.Key)
		if !ok || i >= st.parts {
			if !strict {
				continue
			}
			if st.parts == 0 {
				return fmt.Errorf("%w: blob sink: split %s has no committed output, but %s%s exists: the destination holds output no commit of this job lists; remove it, or give the job an empty destination", pipeline.ErrOutputDamaged, st.split, s.location, obj.Key)
			}
			return fmt.Errorf("%w: blob sink: split %s: %s%s is not one of its %d committed parts: the destination holds output no commit lists; remove it (the committed parts stay)", pipeline.ErrOutputDamaged, st.split, s.location, obj.Key, st.parts)
		}
		if l, ok := unpublished[i]; ok {
			if obj.Size != l {
				return fmt.Errorf("%w: blob sink: split %s: part %s%s holds %d bytes, but its commit lists %d: it was replaced; remove it, and the next owner publishes the committed bytes", pipeline.ErrOutputDamaged, st.split, s.location, obj.Key, obj.Size, l)
			}
			continue // published already
		}
		seen[i] = true
		n++
		total += obj.Size
	}
	if n != st.parts-len(pending) || total != want {
		var missing []string
		for i := range st.parts {
			if _, ok := unpublished[i]; !ok && !seen[i] && len(missing) < 3 {
				missing = append(missing, s.location+PartKey(st.split, i))
			}
		}
		gone := ""
		if len(missing) > 0 {
			gone = fmt.Sprintf(" (missing: %s)", strings.Join(missing, ", "))
		}
		return fmt.Errorf("%w: blob sink: split %s: %d published parts of %d bytes under %s%s, but %d of %d bytes are committed%s: a part was deleted, truncated or replaced; restore it from a backup, or requeue the split from the start after removing its parts (spate requeue)",
			pipeline.ErrOutputDamaged, st.split, n, total, s.location, prefix, st.parts-len(pending), want, gone)
	}
	return nil
}

// publishedAlready returns nil if part pt of split is published at key
// with the bytes the committed record lists, and an error marked
// [pipeline.ErrOutputDamaged] naming the staged object if it is not there
// (its staged object being gone, no retry can publish it).
func (s *Sink) publishedAlready(ctx context.Context, split spate.SplitID, pt part, key string) error {
	data, err := s.b.ReadAll(ctx, key)
	switch {
	case err == nil:
		if int64(len(data)) == pt.Len && crc32.Checksum(data, castagnoli) == pt.CRC {
			return nil
		}
		return fmt.Errorf("%w: blob sink: split %s: part %s%s holds %d bytes other than the %d its commit lists, and the staged object %s%s it is copied from is gone: both were changed under the job; remove the split's parts and requeue it from the start (spate requeue)",
			pipeline.ErrOutputDamaged, split, s.location, key, len(data), pt.Len, s.location, pt.Stage)
	case gcerrors.Code(err) == gcerrors.NotFound:
		return fmt.Errorf("%w: blob sink: split %s: the staged object %s%s, listed by the committed record as part %s%s, was deleted under the job before it was published: restore it, or remove the split's parts and requeue it from the start (spate requeue)",
			pipeline.ErrOutputDamaged, split, s.location, pt.Stage, s.location, key)
	default:
		return fmt.Errorf("blob sink: cannot read part %s%s: %w", s.location, key, fault(err))
	}
}

func partIndex(split spate.SplitID, key string) (int, bool) {
	rest, ok := strings.CutPrefix(key, split.String()+"/")
	if !ok {
		return 0, false
	}
	num, ok := strings.CutSuffix(rest, partSuffix)
	if !ok || len(num) != 8 {
		return 0, false
	}
	i, err := strconv.Atoi(num)
	return i, err == nil && i >= 0
}

// publishFromStage publishes a listed part another tenancy staged: it
// reads and checks the staged object, then writes the part, unless the
// part is already there at its length.
func (s *Sink) publishFromStage(ctx context.Context, split spate.SplitID, p part) error {
	key := PartKey(split, p.I)
	if a, err := s.b.Attributes(ctx, key); err == nil && a.Size == p.Len {
		return nil
	}
	data, err := s.b.ReadAll(ctx, p.Stage)
	if err != nil {
		if gcerrors.Code(err) == gcerrors.NotFound {
			return fmt.Errorf("%w: blob sink: split %s: the staged object %s%s, listed by the committed record as part %d, is gone before it was published: restore it, or requeue the split from the start after removing its parts", pipeline.ErrOutputDamaged, split, s.location, p.Stage, p.I)
		}
		return fmt.Errorf("blob sink: cannot read the staged object %s%s: %w", s.location, p.Stage, fault(err))
	}
	if int64(len(data)) != p.Len || crc32.Checksum(data, castagnoli) != p.CRC {
		return fmt.Errorf("%w: blob sink: split %s: the staged object %s%s is not the bytes the committed record lists for part %d (%d bytes, want %d, or its checksum differs): it was altered; requeue the split from the start after removing its parts", pipeline.ErrOutputDamaged, split, s.location, p.Stage, p.I, len(data), p.Len)
	}
	if err := s.b.WriteAll(ctx, key, data, &blob.WriterOptions{ContentType: "text/plain"}); err != nil {
		return fmt.Errorf("blob sink: cannot publish part %s%s: %w", s.location, key, fault(err))
	}
	return nil
}

func (s *Sink) deletePrefix(ctx context.Context, prefix string) error {
	it := s.b.List(&blob.ListOptions{Prefix: prefix})
	for {
		obj, err := it.Next(ctx)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if obj.IsDir {
			continue
		}
		if err := s.b.Delete(ctx, obj.Key); err != nil && gcerrors.Code(err) != gcerrors.NotFound {
			return err
		}
	}
}

func (s *Sink) stage(p pipeline.PartitionID) (*stage, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stages[p], s.retired[p]
}

// Write implements [pipeline.Sink]: it stages the records in memory.
func (s *Sink) Write(ctx context.Context, shard int, records []pipeline.Record) error {
	return s.WriteChunks(ctx, shard, [][]pipeline.Record{records})
}

// WriteChunks implements [pipeline.ChunkedSink]. Records of a partition
// whose tenancy ended are dropped: they are never committed under it.
func (s *Sink) WriteChunks(ctx context.Context, shard int, chunks [][]pipeline.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	format := s.Format
	if format == nil {
		format = formatLine
	}
	for _, records := range chunks {
		for i := 0; i < len(records); {
			j := i + 1
			for j < len(records) && records[j].Partition == records[i].Partition {
				j++
			}
			if err := s.writeRun(records[i].Partition, records[i:j], format); err != nil {
				return err
			}
			i = j
		}
	}
	return nil
}

// writeRun stages a run of one partition's records under one lock.
func (s *Sink) writeRun(p pipeline.PartitionID, records []pipeline.Record, format func([]byte, pipeline.Record) []byte) error {
	st, retired := s.stage(p)
	if st == nil {
		if retired {
			return nil
		}
		return fmt.Errorf("blob sink: partition %d: %w (%w)", p, pipeline.ErrNoStage, spate.ErrFatal)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return nil
	}
	for _, r := range records {
		if n := len(st.marks); n > 0 && r.Offset < st.marks[n-1].off {
			return fmt.Errorf("blob sink: split %s: record offset %d after %d: a staging sink needs a split's records in offset order (%w)", st.split, r.Offset, st.marks[n-1].off, spate.ErrFatal)
		}
		if len(st.buf) == 0 {
			st.oldest = s.now()
		}
		st.buf = format(st.buf, r)
		st.marks = append(st.marks, mark{off: r.Offset, end: int64(len(st.buf))})
	}
	return nil
}

func formatLine(buf []byte, r pipeline.Record) []byte {
	buf = append(buf, r.Key...)
	buf = append(buf, '\t')
	buf = append(buf, r.Value...)
	return append(buf, '\n')
}

// Prepare implements [pipeline.StagingSink]. It cuts a part of the staged
// bytes below watermark when they are RollSize or more, the oldest of
// them is RollInterval old, or final is set, uploads it as a staged
// object and covers the watermark; otherwise it covers what the parts
// cut before cover.
func (s *Sink) Prepare(ctx context.Context, p pipeline.PartitionID, watermark int64, final bool) ([]byte, int64, bool, error) {
	st, _ := s.stage(p)
	if st == nil {
		return nil, 0, false, fmt.Errorf("blob sink: partition %d has no open stage", p)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	i, _ := slices.BinarySearchFunc(st.marks, watermark, func(m mark, w int64) int {
		if m.off < w {
			return -1
		}
		return 1
	})
	var cut int64
	if i > 0 {
		cut = st.marks[i-1].end
	}
	roll := final || cut == 0 || cut >= s.rollSize() || s.now().Sub(st.oldest) >= s.rollInterval()
	if !roll {
		return st.committable(), min(st.covered, watermark), len(st.pending) > 0, nil
	}
	if cut > 0 {
		data := slices.Clone(st.buf[:cut])
		pt := part{I: st.parts, Stage: stagePrefix + st.split.String() + "/" + strconv.FormatUint(uint64(st.epoch), 10) + "/" + fmt.Sprintf("%08d", st.parts), Len: cut, CRC: crc32.Checksum(data, castagnoli)}
		if err := s.b.WriteAll(ctx, pt.Stage, data, &blob.WriterOptions{ContentType: "text/plain"}); err != nil {
			return nil, 0, false, fmt.Errorf("blob sink: cannot stage part %d of split %s at %s%s: %w", pt.I, st.split, s.location, pt.Stage, fault(err))
		}
		st.pending = append(st.pending, pt)
		st.upload[pt.I] = data
		st.parts++
		st.bytes += cut
		st.buf = st.buf[:copy(st.buf, st.buf[cut:])]
		st.marks = st.marks[:copy(st.marks, st.marks[i:])]
		for k := range st.marks {
			st.marks[k].end -= cut
		}
		if len(st.buf) > 0 {
			st.oldest = s.now()
		}
	} else {
		st.marks = st.marks[:copy(st.marks, st.marks[i:])]
	}
	st.covered = max(st.covered, watermark)
	return st.committable(), watermark, len(st.pending) > 0, nil
}

func (st *stage) committable() []byte {
	b, _ := json.Marshal(commit{V: 1, Parts: st.parts, Bytes: st.bytes, Pending: st.pending})
	return b
}

// Publish implements [pipeline.StagingSink]: it copies each part the
// committable lists to its name.
func (s *Sink) Publish(ctx context.Context, p pipeline.PartitionID, committable []byte) error {
	c, err := decodeCommit(committable)
	if err != nil {
		return err
	}
	st, _ := s.stage(p)
	if st == nil {
		return fmt.Errorf("blob sink: partition %d has no open stage", p)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	mine := false
	for _, pt := range c.Pending {
		_, ok := st.upload[pt.I]
		mine = mine || ok
	}
	if !mine {
		return nil // published already
	}
	// The parts published before must still be there: a part deleted or
	// replaced under the job is gone for good (its staged object went
	// once it was published), and no retry can mend it.
	if err := s.checkParts(ctx, &stage{split: st.split, parts: c.Parts, bytes: c.Bytes}, c.Pending, false); err != nil {
		return err
	}
	for _, pt := range c.Pending {
		data, mine := st.upload[pt.I]
		if !mine {
			continue // published already
		}
		if int64(len(data)) != pt.Len || crc32.Checksum(data, castagnoli) != pt.CRC {
			return fmt.Errorf("blob sink: split %s: the committable lists part %d, which this tenancy did not prepare: not this tenancy's", st.split, pt.I)
		}
		key := PartKey(st.split, pt.I)
		if err := s.b.Copy(ctx, key, pt.Stage, nil); err != nil {
			if gcerrors.Code(err) != gcerrors.NotFound {
				return fmt.Errorf("blob sink: cannot publish part %s%s: %w", s.location, key, fault(err))
			}
			// The staged object is gone: published already (by a new
			// owner, which then deleted it) if the part holds exactly the
			// committed bytes; otherwise it was deleted under the job.
			if err := s.publishedAlready(ctx, st.split, pt, key); err != nil {
				return err
			}
		}
		delete(st.upload, pt.I)
		st.pending = slices.DeleteFunc(st.pending, func(q part) bool { return q.I == pt.I })
		_ = s.b.Delete(ctx, pt.Stage) // best effort: a later owner deletes it too
	}
	return nil
}

// CloseStage implements [pipeline.StagingSink]. A completed split's staged
// objects are deleted.
func (s *Sink) CloseStage(p pipeline.PartitionID, completed bool) {
	s.mu.Lock()
	st := s.stages[p]
	delete(s.stages, p)
	s.retired[p] = true
	s.mu.Unlock()
	if st == nil {
		return
	}
	st.mu.Lock()
	st.closed = true
	st.buf, st.marks, st.upload = nil, nil, nil
	st.mu.Unlock()
	if completed {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = s.deletePrefix(ctx, stagePrefix+st.split.String()+"/")
	}
}

// Close implements [pipeline.Sink]; the bucket is the caller's to close.
func (s *Sink) Close() error { return nil }

// RemoveStaging deletes every staged object left in b once a job
// completed (a zombie's, uploaded after its last commit). Call it only
// after the job completed.
func RemoveStaging(ctx context.Context, b *blob.Bucket) error {
	s := &Sink{b: b}
	return s.deletePrefix(ctx, stagePrefix)
}

func decodeCommit(b []byte) (commit, error) {
	var c commit
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("blob sink: committable %.64q: %w", b, err)
	}
	if c.V != 1 || c.Parts < 0 || c.Bytes < 0 || len(c.Pending) > c.Parts {
		return c, fmt.Errorf("blob sink: committable %.64q is not a version-1 blob committable", b)
	}
	for _, p := range c.Pending {
		if p.I < 0 || p.I >= c.Parts || p.Len < 0 || !strings.HasPrefix(p.Stage, stagePrefix) || strings.Contains(p.Stage, "..") {
			return c, fmt.Errorf("blob sink: committable %.64q lists a part outside the staging area", b)
		}
	}
	return c, nil
}
