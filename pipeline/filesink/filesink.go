package filesink

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/spate-go/spate/pipeline"
)

// FileSink appends records to one file per shard and fsyncs before it
// reports a write durable, so an acknowledged record survives a crash. A
// failed write is rolled back (the file is truncated to its size before the
// write) before the batch is retried, so a retry never leaves a torn line.
//
// Each record becomes one line: Format's output, by default the key, a tab,
// the value and a newline.
type FileSink struct {
	dir, prefix string
	// Format renders one record onto buf.
	Format func(buf []byte, r pipeline.Record) []byte
	mu     sync.Mutex
	files  map[int]*fileShard
}

type fileShard struct {
	mu   sync.Mutex
	f    *os.File
	size int64
}

// fileWriteChunk is how many formatted bytes a write gathers before it
// hands them to the file: a write of any size needs no more buffer.
const fileWriteChunk = 256 << 10

// fileBufs holds the format buffers of every FileSink of the process: a
// write borrows one for its duration, so a sink opened per run (or per
// shard) does not grow a fresh 256 KiB buffer, and an idle shard holds
// none.
var fileBufs = sync.Pool{New: func() any {
	b := make([]byte, 0, fileWriteChunk+fileWriteChunk/4)
	return &b
}}

// NewFileSink writes shard i to dir/<prefix>-<i>.out.
func NewFileSink(dir, prefix string) (*FileSink, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("file sink: %w", err)
	}
	return &FileSink{dir: dir, prefix: prefix, files: map[int]*fileShard{}, Format: formatLine}, nil
}

func formatLine(buf []byte, r pipeline.Record) []byte {
	buf = append(buf, r.Key...)
	buf = append(buf, '\t')
	buf = append(buf, r.Value...)
	return append(buf, '\n')
}

// Path is the file of shard i.
func (s *FileSink) Path(shard int) string {
	return filepath.Join(s.dir, s.prefix+"-"+strconv.Itoa(shard)+".out")
}

func (s *FileSink) shard(i int) (*fileShard, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fs := s.files[i]; fs != nil {
		return fs, nil
	}
	f, err := os.OpenFile(s.Path(i), os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	fs := &fileShard{f: f, size: st.Size()}
	s.files[i] = fs
	return fs, nil
}

// Write implements [pipeline.Sink]: append, fsync, then report durable.
func (s *FileSink) Write(ctx context.Context, shard int, records []pipeline.Record) error {
	return s.WriteChunks(ctx, shard, [][]pipeline.Record{records})
}

// WriteChunks implements [pipeline.ChunkedSink]: the lines of all the chunks are
// appended through one pooled buffer (in pieces of at most 256 KiB, so a
// write of any size allocates nothing), then fsynced once.
func (s *FileSink) WriteChunks(ctx context.Context, shard int, chunks [][]pipeline.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	fs, err := s.shard(shard)
	if err != nil {
		return fmt.Errorf("file sink: open shard %d: %w", shard, err)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	// Format into a pooled buffer and write it out whenever it holds
	// fileWriteChunk bytes, then fsync once.
	pb := fileBufs.Get().(*[]byte)
	buf := (*pb)[:0]
	defer func() {
		if cap(buf) <= 2*fileWriteChunk { // a huge line grew it: do not keep that
			*pb = buf[:0]
			fileBufs.Put(pb)
		}
	}()
	written := int64(0)
	put := func() error {
		n, err := fs.f.WriteAt(buf, fs.size+written)
		written += int64(n)
		buf = buf[:0]
		return err
	}
	for _, records := range chunks {
		for i := range records {
			buf = s.Format(buf, records[i])
			if len(buf) >= fileWriteChunk {
				if err = put(); err != nil {
					break
				}
			}
		}
		if err != nil {
			break
		}
	}
	if err == nil && len(buf) > 0 {
		err = put()
	}
	if err == nil {
		err = fs.f.Sync()
	}
	if err != nil {
		if written > 0 {
			// Roll back the partial write so a retry cannot tear a line.
			if terr := fs.f.Truncate(fs.size); terr != nil {
				return fmt.Errorf("file sink: write shard %d: %w (rollback failed: %v)", shard, err, terr)
			}
		}
		return fmt.Errorf("file sink: write shard %d: %w", shard, err)
	}
	fs.size += written
	return nil
}

// Destination implements [pipeline.SinkDestination]: the directory written to.
func (s *FileSink) Destination() string { return s.dir }

// Close closes the files.
func (s *FileSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var first error
	for i, fs := range s.files {
		if err := fs.f.Close(); err != nil && first == nil {
			first = err
		}
		delete(s.files, i)
	}
	return first
}
