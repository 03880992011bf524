package filesource_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesink"
	"github.com/spate-go/spate/pipeline/filesource"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// corpus writes files under dir and returns every line as "name:offset".
func corpus(t *testing.T, dir string, files map[string]string) map[string]string {
	t.Helper()
	lines := map[string]string{}
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
		off := 0
		for off < len(content) {
			end := strings.IndexByte(content[off:], '\n')
			next := len(content)
			if end >= 0 {
				next = off + end + 1
			}
			lines[name+":"+strconv.Itoa(off)] = strings.TrimSuffix(content[off:next], "\n")
			off = next
		}
	}
	return lines
}

func genCorpus(t *testing.T, dir string, nfiles, maxLines int, seed uint64) map[string]string {
	r := rand.New(rand.NewPCG(seed, seed))
	files := map[string]string{}
	for i := range nfiles {
		var b strings.Builder
		n := r.IntN(maxLines + 1)
		for j := range n {
			fmt.Fprintf(&b, "file %d line %d %s\n", i, j, strings.Repeat("x", r.IntN(40)))
		}
		content := b.String()
		if i%7 == 3 && len(content) > 0 {
			content = content[:len(content)-1] // no trailing newline
		}
		files[fmt.Sprintf("d%d/f%03d.txt", i%3, i)] = content
	}
	return files
}

// openLane opens a lane of spec on src; poison defaults to failing t.
func openLane(t *testing.T, src *filesource.Source, spec spate.SplitSpec, progress *spate.SplitProgress, cp *pipeline.Checkpointer, poison func(string)) pipeline.Lane {
	t.Helper()
	if poison == nil {
		poison = func(r string) { t.Errorf("poison: %s", r) }
	}
	l, err := src.OpenSplit(pipeline.SplitOpening{Spec: spec, Progress: progress, Issuer: cp.Issuer(), Waker: spate.InertWaker(), Poison: poison})
	require.NoError(t, err)
	return l
}

// readUntilDone polls until the lane has nothing left to read (a failed
// read returns an empty batch without ending the lane). It keeps copies of
// the payloads: a lane reuses their memory on its next poll.
func readUntilDone(t *testing.T, src *filesource.Source, id spate.SplitID, l pipeline.Lane, max int) []pipeline.RawPayload {
	t.Helper()
	var out []pipeline.RawPayload
	for range 100000 {
		b, err := l.Poll(max, 0)
		require.NoError(t, err)
		if b == nil {
			if !src.Unfinished(id) {
				return out
			}
			continue
		}
		for _, p := range b.Payloads {
			p.Key = bytes.Clone(p.Key)
			p.Value = bytes.Clone(p.Value)
			out = append(out, p)
		}
		b.Ack.Release()
	}
	require.Fail(t, "lane never ended")
	return nil
}

// localCoord is a single-instance coordinator in the shape of the seed's
// LocalCoordinator: it plans on Start, grants every split, and keeps
// progress in a store shared across runs, so a rerun resumes.
type localCoord struct {
	mu       sync.Mutex
	waker    spate.Waker
	durable  *localStore
	pending  []spate.Event
	held     map[spate.SplitID]bool
	finished bool
}

type localStore struct {
	mu       sync.Mutex
	specs    []spate.SplitSpec
	progress map[spate.SplitID]spate.SplitProgress
}

func (c *localCoord) SetWaker(w spate.Waker) { c.waker = w }

func (c *localCoord) Start(planner spate.SplitPlanner) error {
	c.durable.mu.Lock()
	defer c.durable.mu.Unlock()
	if c.durable.specs == nil {
		plan, err := planner.Plan(context.Background(), spate.PlanContext{Generation: 1})
		if err != nil {
			return err
		}
		for _, s := range plan.Splits {
			c.durable.specs = append(c.durable.specs, s.Spec)
		}
	}
	c.held = map[spate.SplitID]bool{}
	for _, s := range c.durable.specs {
		p, ok := c.durable.progress[s.ID]
		if ok && p.Completed {
			continue
		}
		ev := spate.Gained{Split: s, Epoch: 1}
		if ok {
			p := p
			ev.Progress = &p
		}
		c.pending = append(c.pending, ev)
		c.held[s.ID] = true
	}
	return nil
}

func (c *localCoord) Poll() ([]spate.Event, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	evs := c.pending
	c.pending = nil
	if !c.finished {
		c.durable.mu.Lock()
		done := 0
		for _, s := range c.durable.specs {
			if c.durable.progress[s.ID].Completed {
				done++
			}
		}
		c.durable.mu.Unlock()
		if done == len(c.durable.specs) {
			c.finished = true
			evs = append(evs, spate.AllComplete{})
		}
	}
	return evs, nil
}

func (c *localCoord) CommitAt(_ context.Context, s spate.SplitID, _ spate.LeaseEpoch, p spate.SplitProgress) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.held[s] {
		return spate.Fencedf("not held")
	}
	c.durable.mu.Lock()
	defer c.durable.mu.Unlock()
	if old, ok := c.durable.progress[s]; ok && p.Watermark < old.Watermark {
		return spate.Fatalf("watermark regressed")
	}
	c.durable.progress[s] = p
	if p.Completed {
		delete(c.held, s)
	}
	c.waker.Wake()
	return nil
}

func (c *localCoord) Fail(context.Context, spate.SplitID, string) error { return nil }

func (c *localCoord) Release(_ context.Context, ids ...spate.SplitID) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		delete(c.held, id)
	}
	return nil
}

func (c *localCoord) ReleaseDrained(ctx context.Context, ids ...spate.SplitID) error {
	return c.Release(ctx, ids...)
}

func (c *localCoord) DeclineRevoke(context.Context, spate.SplitID) error { return nil }

func (c *localCoord) Depart(context.Context) error { return nil }

func (c *localCoord) Close() error { return nil }

// outputLines reads a file sink's output back as key -> count.
func outputLines(t *testing.T, fs *filesink.FileSink, shards int) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for i := range shards {
		f, err := os.Open(fs.Path(i))
		if os.IsNotExist(err) {
			continue
		}
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			key, _, _ := strings.Cut(sc.Text(), "\t")
			seen[key]++
		}
		f.Close()
	}
	return seen
}

func testConfig() pipeline.Config {
	return pipeline.Config{
		Name: "backfill", Threads: 2, CommitInterval: 20 * time.Millisecond, DrainTimeout: 3 * time.Second,
		PollTimeout: 2 * time.Millisecond, IdleFlush: 5 * time.Millisecond, EventPollTimeout: 5 * time.Millisecond,
		MaxRecords: 64,
	}
}

func sinkOpts() pipeline.SinkOptions {
	return pipeline.SinkOptions{Shards: 2, Linger: 2 * time.Millisecond, ChunkTargetBytes: 4 << 10}
}
