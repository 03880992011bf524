package pgsink_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	osexec "os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/etcdservers"
	"github.com/spate-go/spate/internal/redisservers"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/pgsink"
	"github.com/spate-go/spate/pipeline/pgsource"
	_ "github.com/spate-go/spate/stores/etcd"
	_ "github.com/spate-go/spate/stores/redis"
	"github.com/spate-go/spate/storeurl"
)

// workerEnv, when set, makes the test binary a table-copy worker (see
// runWorker) instead of running tests: the trial's processes.
const workerEnv = "SPATE_PGSINK_WORKER"

// trialRowsEnv sets the trial's table size (default trialRows): the full
// trial is SPATE_PGSINK_TRIAL_ROWS=2000000.
const trialRowsEnv = "SPATE_PGSINK_TRIAL_ROWS"

const trialRows = 50_000

// workerArgs is what a worker process is told, as JSON in workerEnv.
type workerArgs struct {
	Store, DB, Job, Name string
	Lease                time.Duration
	Rate                 float64 // rows per second, 0: unlimited
	Chunk                int64
}

// runWorker is a worker process: one coordinator with its own store
// client, pgsource into pgsink. It prints its gains and losses, and each
// flush the database fenced, one a line, and exits 0 once the job
// completed.
func runWorker() int {
	var a workerArgs
	if err := json.Unmarshal([]byte(os.Getenv(workerEnv)), &a); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	ctx := context.Background()
	err := func() error {
		st, err := storeurl.OpenStore(ctx, a.Store, a.Job, a.Lease, storeurl.Options{})
		if err != nil {
			return err
		}
		defer st.Close()
		log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		cfg := spate.TimingsForLease(a.Lease)
		cfg.InstanceID = a.Name
		coord, err := spate.NewStoreCoordinator(st, cfg, spate.WithLogger(log))
		if err != nil {
			return err
		}
		defer coord.Close()
		src, err := pgsource.New(ctx, pgsource.Options{URL: a.DB, Table: "src", ChunkRows: a.Chunk, PackRows: true})
		if err != nil {
			return err
		}
		sink, err := pgsink.New(ctx, pgsink.Options{URL: a.DB, Table: "dst", Job: a.Job, Shape: src.Table().Columns, Lease: a.Lease})
		if err != nil {
			return err
		}
		defer sink.Close()
		rt, err := pipeline.Build(pipeline.Config{Name: a.Name, CommitInterval: 200 * time.Millisecond},
			pipeline.NewCoordinatedSource(&loudCoord{coord}, src, src), pace(a.Rate),
			[]pipeline.SinkSpec{{Name: "pg", Sink: &loudSink{sink}}}, pipeline.WithLogger(log))
		if err != nil {
			return err
		}
		rep, err := rt.Run(ctx)
		return errors.Join(err, rep.Err())
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	fmt.Println("done")
	return 0
}

// loudCoord prints the coordinator's gains and losses.
type loudCoord struct{ *spate.StoreCoordinator }

func (c *loudCoord) Poll() ([]spate.Event, error) {
	evs, err := c.StoreCoordinator.Poll()
	for _, ev := range evs {
		switch e := ev.(type) {
		case spate.Gained:
			fmt.Printf("gained %s (epoch %d)\n", e.Split.ID, e.Epoch)
		case spate.Lost:
			fmt.Printf("lost %s\n", e.Split)
		}
	}
	return evs, err
}

// loudSink prints each flush the database fenced.
type loudSink struct{ *pgsink.Sink }

func (s *loudSink) Prepare(ctx context.Context, p pipeline.PartitionID, w int64, final bool) ([]byte, int64, bool, error) {
	out, covered, pending, err := s.Sink.Prepare(ctx, p, w, final)
	if errors.Is(err, spate.ErrFenced) {
		fmt.Printf("fenced in the database: %v\n", err)
	}
	return out, covered, pending, err
}

// pace is a chain that admits at most perSecond rows a second (none
// when 0): a worker limited to a fixed rate. A packed record (pgsource's
// PackRows) counts its rows, one a line.
func pace(perSecond float64) []pipeline.Stage {
	if perSecond <= 0 {
		return nil
	}
	every := time.Duration(float64(time.Second) / perSecond)
	var mu sync.Mutex
	var next time.Time
	return []pipeline.Stage{pipeline.Map("pace", pipeline.Fail, func(r pipeline.Record) (pipeline.Record, error) {
		mu.Lock()
		now := time.Now()
		if floor := now.Add(-50 * time.Millisecond); next.Before(floor) {
			next = floor // lateness is made up for, an idle spell is not saved up
		}
		next = next.Add(time.Duration(bytes.Count(r.Value, []byte{'\n'})+1) * every)
		ahead := next.Sub(now)
		mu.Unlock()
		if ahead > time.Millisecond {
			time.Sleep(ahead) // throttling, not waiting for a condition
		}
		return r, nil
	})}
}

// proc is a worker process and its output.
type proc struct {
	name string
	cmd  *osexec.Cmd
	done chan struct{}
	mu   sync.Mutex
	out  strings.Builder
	errs strings.Builder
}

func (p *proc) stdout() string { p.mu.Lock(); defer p.mu.Unlock(); return p.out.String() }
func (p *proc) stderr() string { p.mu.Lock(); defer p.mu.Unlock(); return p.errs.String() }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func startWorker(t *testing.T, a workerArgs) *proc {
	t.Helper()
	b, err := json.Marshal(a)
	require.NoError(t, err)
	p := &proc{name: a.Name, done: make(chan struct{})}
	p.cmd = osexec.Command(os.Args[0])
	p.cmd.Env = append(os.Environ(), workerEnv+"="+string(b))
	outR, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	errR, err := p.cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, p.cmd.Start())
	var wg sync.WaitGroup
	copyTo := func(r io.Reader, sb *strings.Builder) {
		s := bufio.NewScanner(r)
		for s.Scan() {
			p.mu.Lock()
			sb.WriteString(s.Text() + "\n")
			p.mu.Unlock()
		}
	}
	wg.Go(func() { copyTo(outR, &p.out) })
	wg.Go(func() { copyTo(errR, &p.errs) })
	go func() {
		wg.Wait()
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.exited() {
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// waitUntil polls cond until it holds, failing t after limit (a bound
// far above the condition's expected time, never a speed assertion).
func waitUntil(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			require.FailNow(t, "timed out waiting: "+what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tableSum is a table's row count and a checksum of its rows, in key
// order.
func tableSum(t *testing.T, c *pgx.Conn, table string) (int64, string) {
	t.Helper()
	var n int64
	var sum string
	require.NoError(t, c.QueryRow(context.Background(), fmt.Sprintf(
		"SELECT count(*), coalesce(md5(string_agg(t::text, E'\\n' ORDER BY id, t::text)), '') FROM %s t", table)).Scan(&n, &sum))
	return n, sum
}

var gainedLater = regexp.MustCompile(`gained \S+ \(epoch ([2-9]|[1-9][0-9]+)\)`)

// The trial: three worker processes copy a table into one WITHOUT
// a primary key; one is SIGKILLed mid-run (not restarted: the others take
// its splits over once its leases expire) and another SIGSTOPped past its
// lease, then SIGCONTed (a zombie: its late flushes are fenced in the
// database). On Redis and on etcd (embedded, the default store), the
// destination then holds every source row exactly once: 0 duplicates, 0
// missing, the same checksum. CI copies 50,000 rows; the full trial is
// SPATE_PGSINK_TRIAL_ROWS=2000000.
func TestWorkersKilledAndStoppedCopyExactlyOnce(t *testing.T) {
	rows := trialRows
	if v := os.Getenv(trialRowsEnv); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, trialRowsEnv)
		rows = n
	}
	full := rows > trialRows
	const lease = 2 * time.Second
	stores := map[string]func(t *testing.T) string{
		"redis": func(t *testing.T) string { return "redis://" + redisservers.Start(t, redisservers.WithAOF()).Addr() },
		"etcd": func(t *testing.T) string {
			return "etcd://" + etcdservers.Start(t, etcdservers.Options{}).Members()[0].ClientURL.Host
		},
	}
	for _, name := range []string{"redis", "etcd"} {
		t.Run(name, func(t *testing.T) {
			if !full {
				t.Parallel()
			}
			store := stores[name](t)
			url, c := newDB(t)
			exec(t, c, fmt.Sprintf(`CREATE TABLE src (id bigint PRIMARY KEY, v text, n bigint, at timestamptz);
				INSERT INTO src SELECT i,
					CASE WHEN i %% 97 = 0 THEN NULL WHEN i %% 89 = 0 THEN E'tab\there\nline\\back' ELSE md5(i::text) END,
					i * 7, '2026-01-01'::timestamptz + i * interval '1 second'
				FROM generate_series(1, %d) i;
				CREATE TABLE dst (LIKE src); ANALYZE src;`, rows))
			// In CI each worker is held to a rate so that the faults land
			// mid-run; the full trial runs at full speed.
			a := workerArgs{Store: store, DB: url, Job: "trial-" + name, Lease: lease, Rate: 4000, Chunk: 2000}
			if full {
				a.Rate, a.Chunk = 0, 50_000
			}
			var ws []*proc
			for i := range 3 {
				a.Name = fmt.Sprintf("w%d", i)
				ws = append(ws, startWorker(t, a))
			}
			copied := func() int64 {
				var n int64
				require.NoError(t, c.QueryRow(context.Background(), "SELECT count(*) FROM dst").Scan(&n))
				return n
			}
			started := time.Now()
			// The worker killed holds a split and has flushed rows.
			killed := ws[0]
			waitUntil(t, 2*time.Minute, "w0 gains a split and a tenth of the rows are in", func() bool {
				return strings.Contains(killed.stdout(), "gained ") && copied() >= int64(rows/10)
			})
			require.NoError(t, killed.cmd.Process.Kill())
			<-killed.done
			// A survivor still running is stopped past its lease once a
			// third of the rows are in.
			waitUntil(t, 2*time.Minute, "a third of the rows are in", func() bool { return copied() >= int64(rows/3) })
			var stopped *proc
			for _, w := range ws[1:] {
				if !w.exited() && stopped == nil {
					stopped = w
				}
			}
			require.NotNil(t, stopped, "both survivors exited before the stop:\n%s\n%s", ws[1].stderr(), ws[2].stderr())
			require.NoError(t, stopped.cmd.Process.Signal(syscall.SIGSTOP))
			time.Sleep(lease + 1500*time.Millisecond) // the fault's length: past the lease
			require.NoError(t, stopped.cmd.Process.Signal(syscall.SIGCONT))
			for _, w := range ws[1:] {
				select {
				case <-w.done:
				case <-time.After(5 * time.Minute):
					require.FailNow(t, "worker did not finish", "%s:\n%s\n%s", w.name, w.stdout(), w.stderr())
				}
				require.Zero(t, w.cmd.ProcessState.ExitCode(), "%s:\nstdout:\n%s\nstderr:\n%s", w.name, w.stdout(), w.stderr())
			}
			elapsed := time.Since(started)
			out := ws[1].stdout() + ws[2].stdout()
			// The faults took effect: a survivor took a split over at a
			// later epoch, and the stopped worker came back a zombie.
			require.Regexp(t, gainedLater, out, "no split was taken over")
			require.Contains(t, stopped.stdout(), "lost ", "the stopped worker lost nothing: it was not a zombie")

			missing, dups, alien := audit(t, c, "dst", rows)
			srcN, srcSum := tableSum(t, c, "src")
			dstN, dstSum := tableSum(t, c, "dst")
			t.Logf("%s: %d rows, 3 workers (w0 SIGKILLed, %s SIGSTOPped %v), %v: dst %d rows, %d duplicate, %d missing, %d alien; checksum src %s dst %s; takeovers %d, database-fenced flushes %d",
				name, rows, stopped.name, lease+1500*time.Millisecond, elapsed.Round(time.Millisecond), dstN, dups, missing, alien, srcSum, dstSum,
				len(gainedLater.FindAllString(out, -1)), strings.Count(out, "fenced in the database"))
			require.Zero(t, dups, "duplicates")
			require.Zero(t, missing, "missing")
			require.Zero(t, alien)
			require.Equal(t, srcN, dstN)
			require.Equal(t, srcSum, dstSum, "checksum")
			var fences int
			require.NoError(t, c.QueryRow(context.Background(), "SELECT count(*) FROM spate_fence").Scan(&fences))
			require.Zero(t, fences, "the job's fence rows are cleaned up when it completes")
		})
	}
}
