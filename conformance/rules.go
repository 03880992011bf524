package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"
)

// Rule is one rule of a suite: a named check of one sentence of a contract.
type Rule struct {
	// Name names the rule: its subtest under [RunStore] and
	// [RunCoordinator], its [Result] under [CheckStore] and
	// [CheckCoordinator].
	Name string
	// Contract is the sentence the rule checks. A store rule quotes it
	// verbatim from the documentation of [spate.Store], its types and its
	// error classes (the package documentation maps every sentence there
	// to its rules); a coordinator rule states the guarantee in words.
	Contract string
	// Capability names the optional store capability the rule belongs to
	// ("spate.Releaser", "spate.KeyWatcher", "spate.Sessioner"), or is
	// empty for the contract every store keeps. A rule of a capability
	// skips on a store without it.
	Capability string

	body func(*env)
}

// names returns the rules' names, in order.
func names(rules []Rule) []string {
	out := make([]string, len(rules))
	for i, r := range rules {
		out[i] = r.Name
	}
	return out
}

// runRules runs the selected rules of suite as subtests of t.
func runRules(t *testing.T, suite string, rules []Rule, mk HarnessMaker, opts []Option) {
	t.Helper()
	o, err := collect(suite, names(rules), opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		if o.keep(suite, r.Name) {
			run(t, o, r.Name, mk, r.body)
		}
	}
}

// Status is how a rule ended.
type Status uint8

// The statuses of a [Result].
const (
	Passed Status = iota + 1
	Failed
	Skipped
)

func (s Status) String() string {
	switch s {
	case Passed:
		return "PASS"
	case Failed:
		return "FAIL"
	case Skipped:
		return "SKIP"
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// Result is how one rule ended under [CheckStore] or [CheckCoordinator].
type Result struct {
	// Rule is the rule's full name: the suite, a slash, the rule
	// ("Store/GuardedDelete").
	Rule string
	// Contract is the sentence the rule checks (see [Rule]).
	Contract string
	Status   Status
	Elapsed  time.Duration
	// Log holds what the rule logged, its failure messages and the reason
	// of a skip included, in order.
	Log []string
}

// RuleError is a broken rule, as [CheckStore] and [CheckCoordinator]
// return it.
type RuleError struct {
	Rule     string // the rule's full name
	Contract string // the sentence the rule checks
	// Messages are the rule's log lines, its failure messages among them.
	Messages []string
}

func (e *RuleError) Error() string {
	return fmt.Sprintf("%s failed (contract: %s)\n\t%s", e.Rule, e.Contract, strings.Join(e.Messages, "\n\t"))
}

// CheckStore runs the store rules (see [StoreRules]) against the driver
// behind newHarness in this process, without a testing.T, the way
// testing/fstest.TestFS checks a file system: it returns nil if every rule
// passed (or was skipped), and otherwise an error joining one [*RuleError]
// per broken rule. [OnResult] reports each rule as it ends; [Select],
// [Skip] and [Parallel] shape the run. The harness maker gets a
// testing.TB that records into the rule's result; it supports Cleanup,
// Context, the logging, failing and skipping methods and TempDir, and
// fails the rule on Setenv and Chdir.
//
// If ctx ends first, CheckStore returns at once, reporting every rule
// still running as failed; those rules' goroutines and cleanups are left
// to finish on their own.
func CheckStore(ctx context.Context, newHarness HarnessMaker, opts ...Option) error {
	return check(ctx, "Store", StoreRules, newHarness, opts)
}

// CheckCoordinator runs the coordinator rules (see [CoordinatorRules]) as
// [CheckStore] runs the store rules.
func CheckCoordinator(ctx context.Context, newHarness HarnessMaker, opts ...Option) error {
	return check(ctx, "Coordinator", CoordinatorRules, newHarness, opts)
}

func check(ctx context.Context, suite string, rules []Rule, mk HarnessMaker, opts []Option) error {
	o, err := collect(suite, names(rules), opts)
	if err != nil {
		return err
	}
	if o.virtualTime {
		return fmt.Errorf("conformance: VirtualTime needs a testing.T (synctest bubbles do); use Run%s", suite)
	}
	parallel := o.parallel
	if parallel <= 0 {
		parallel = runtime.GOMAXPROCS(0)
	}
	if o.serial {
		parallel = 1
	}
	type job struct {
		rule Rule
		t    *ruleT
	}
	var jobs []job
	for _, r := range rules {
		if o.keep(suite, r.Name) {
			jobs = append(jobs, job{r, newRuleT(ctx, suite+"/"+r.Name)})
		}
	}
	var (
		mu       sync.Mutex
		reported = map[string]bool{}
		failed   []error
	)
	report := func(j job) {
		res := j.t.result(j.rule.Contract)
		mu.Lock()
		defer mu.Unlock()
		if reported[res.Rule] {
			return
		}
		reported[res.Rule] = true
		if res.Status == Failed {
			failed = append(failed, &RuleError{Rule: res.Rule, Contract: res.Contract, Messages: res.Log})
		}
		if o.onResult != nil {
			o.onResult(res)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sem := make(chan struct{}, parallel)
		var wg sync.WaitGroup
		defer wg.Wait()
		for _, j := range jobs {
			if ctx.Err() != nil {
				return
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Go(func() {
				defer func() { <-sem }()
				if why, ok := o.skip[j.rule.Name]; ok {
					j.t.skip(why)
				} else {
					j.t.run(func(tb testing.TB) []func(testing.TB) { return runBody(tb, mk, j.rule.body, false, nil) })
				}
				report(j)
			})
		}
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
	// Both arms can be ready at once when the context ends: the scheduling
	// goroutine then returns early and closes done. Either way, a rule
	// that was never reported did not finish, and fails.
	for _, j := range jobs {
		mu.Lock()
		seen := reported[j.t.name]
		mu.Unlock()
		if !seen {
			j.t.Errorf("the run ended before the rule did: %v", context.Cause(ctx))
			report(j)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	return errors.Join(failed...)
}

// ruleT is the testing.TB of a rule run by CheckStore or CheckCoordinator.
// It embeds a nil testing.TB only to satisfy the interface's unexported
// method; it implements every method itself.
type ruleT struct {
	testing.TB

	name   string
	ctx    context.Context
	cancel context.CancelFunc
	start  time.Time

	mu       sync.Mutex
	log      []string
	failed   bool
	skipped  bool
	elapsed  time.Duration // once finished
	cleanups []func()
}

func newRuleT(ctx context.Context, name string) *ruleT {
	rctx, cancel := context.WithCancel(ctx)
	return &ruleT{name: name, ctx: rctx, cancel: cancel}
}

// run runs body as the rule's goroutine, then what it asked to run after
// it, then the cleanups, as the testing package does.
func (r *ruleT) run(body func(testing.TB) []func(testing.TB)) {
	r.mu.Lock()
	r.start = time.Now()
	r.mu.Unlock()
	var after []func(testing.TB)
	r.guarded(func() { after = body(r) })
	for _, f := range after {
		if r.Failed() || r.Skipped() {
			break
		}
		r.guarded(func() { f(r) })
	}
	r.cancel()
	for {
		r.mu.Lock()
		n := len(r.cleanups)
		if n == 0 {
			r.mu.Unlock()
			break
		}
		f := r.cleanups[n-1]
		r.cleanups = r.cleanups[:n-1]
		r.mu.Unlock()
		r.guarded(f)
	}
	r.mu.Lock()
	r.elapsed = time.Since(r.start)
	r.mu.Unlock()
}

// guarded runs f on a goroutine of its own, so that FailNow and SkipNow
// (runtime.Goexit) end f alone, and turns a panic into a failure.
func (r *ruleT) guarded(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if p := recover(); p != nil {
				r.Errorf("panic: %v\n%s", p, debug.Stack())
			}
		}()
		f()
	}()
	<-done
}

func (r *ruleT) skip(why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, why)
	r.skipped = true
}

func (r *ruleT) result(contract string) Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := Result{Rule: r.name, Contract: contract, Status: Passed, Elapsed: r.elapsed, Log: append([]string(nil), r.log...)}
	switch {
	case r.failed:
		res.Status = Failed
	case r.skipped:
		res.Status = Skipped
	}
	if !r.start.IsZero() && res.Elapsed == 0 {
		res.Elapsed = time.Since(r.start)
	}
	return res
}

func (r *ruleT) logf(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, strings.TrimSuffix(s, "\n"))
}

func (r *ruleT) Name() string             { return r.name }
func (r *ruleT) Context() context.Context { return r.ctx }
func (r *ruleT) Helper()                  {}
func (r *ruleT) Log(args ...any)          { r.logf(fmt.Sprintln(args...)) }
func (r *ruleT) Logf(format string, args ...any) {
	r.logf(fmt.Sprintf(format, args...))
}
func (r *ruleT) Attr(key, value string) { r.logf(key + ": " + value) }
func (r *ruleT) Output() io.Writer      { return ruleWriter{r} }

func (r *ruleT) Fail() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
}

func (r *ruleT) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *ruleT) FailNow() {
	r.Fail()
	runtime.Goexit()
}

func (r *ruleT) Error(args ...any) {
	r.Log(args...)
	r.Fail()
}

func (r *ruleT) Errorf(format string, args ...any) {
	r.Logf(format, args...)
	r.Fail()
}

func (r *ruleT) Fatal(args ...any) {
	r.Log(args...)
	r.FailNow()
}

func (r *ruleT) Fatalf(format string, args ...any) {
	r.Logf(format, args...)
	r.FailNow()
}

func (r *ruleT) Skip(args ...any) {
	r.Log(args...)
	r.SkipNow()
}

func (r *ruleT) Skipf(format string, args ...any) {
	r.Logf(format, args...)
	r.SkipNow()
}

func (r *ruleT) SkipNow() {
	r.mu.Lock()
	r.skipped = true
	r.mu.Unlock()
	runtime.Goexit()
}

func (r *ruleT) Skipped() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.skipped
}

func (r *ruleT) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

func (r *ruleT) Setenv(key, _ string) { r.Fatalf("Setenv(%q) is not supported outside go test", key) }
func (r *ruleT) Chdir(dir string)     { r.Fatalf("Chdir(%q) is not supported outside go test", dir) }
func (r *ruleT) ArtifactDir() string  { return r.TempDir() }

func (r *ruleT) TempDir() string {
	dir, err := os.MkdirTemp("", "conformance-")
	if err != nil {
		r.Fatalf("TempDir: %v", err)
	}
	r.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// ruleWriter is a rule's Output: each write is logged.
type ruleWriter struct{ r *ruleT }

func (w ruleWriter) Write(p []byte) (int, error) {
	w.r.logf(string(p))
	return len(p), nil
}
