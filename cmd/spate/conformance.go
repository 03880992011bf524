package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/conformance/live"
)

const conformanceAbout = `Runs the store conformance suite, the same one every spate driver's tests run,
against a live deployment, so a team can check its own etcd, Redis or NATS before
trusting it with a job: a refused script, a TTL floor above the lease, a missing
ACL grant or a lossy expiry shows up as a failed rule. With --coordinator it also
runs the coordinator scenarios (several coordinators over the store: fencing,
takeovers, revocations, quarantine; minutes rather than seconds).

Every harness uses a fresh namespace (job conformance-<random>) and deletes it
afterwards. Prints a table of rules with the rule broken for each failure; exits
0 only if every rule passed.`

// cleanupFailed marks the failure of a rule whose namespace the harness
// (conformance/live) could not delete; the run collects them.
const cleanupFailed = "harness: close: delete the namespace"

// ruleResult is one row of the rule table.
type ruleResult struct {
	name    string
	result  string // PASS, FAIL, SKIP
	elapsed string
	msgs    []string
}

func rowOf(r conformance.Result) ruleResult {
	var msgs []string
	for _, entry := range r.Log {
		msgs = append(msgs, logLines(entry)...)
	}
	return ruleResult{name: r.Rule, result: r.Status.String(), elapsed: fmt.Sprintf("%.2fs", r.Elapsed.Seconds()), msgs: msgs}
}

// logLines turns one log entry of a rule into table lines. A testify
// failure (Error Trace, Error, Messages) becomes its message, which
// states the rule, then what it saw, without the source trace and diff.
func logLines(entry string) []string {
	if !strings.Contains(entry, "Error Trace:") {
		return strings.Split(strings.TrimSpace(entry), "\n")
	}
	fields := map[string][]string{}
	label := ""
	for _, l := range strings.Split(entry, "\n") {
		l = strings.TrimSpace(l)
		for _, k := range []string{"Error Trace:", "Error:", "Messages:", "Test:"} {
			if strings.HasPrefix(l, k) {
				label, l = k, strings.TrimSpace(l[len(k):])
				break
			}
		}
		if l != "" {
			fields[label] = append(fields[label], l)
		}
	}
	var out []string
	out = append(out, fields["Messages:"]...)
	for _, l := range fields["Error:"] {
		if strings.HasPrefix(l, "Diff:") {
			break
		}
		out = append(out, "  "+l)
	}
	return out
}

func runConformance(args []string) int {
	fs := newFlagSet("conformance", "--store URL [--coordinator] [flags]", conformanceAbout)
	var cf conformanceFlags
	cf.register(fs)
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if err := cf.validate(pos); err != nil {
		return usageError(fs, "%v", err)
	}
	log, err := cf.lf.logger(os.Stderr)
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	var re *regexp.Regexp // --run: rules whose Suite/Rule name it matches
	if cf.runPat != "" {
		if re, err = regexp.Compile(cf.runPat); err != nil {
			return fail(exitUsage, "--run: %v", err)
		}
	}
	start := time.Now()
	ctx := context.Background()

	reg := newRegistry()
	cr := &conformanceRun{verbose: cf.verbose, tty: isTerminal(os.Stdout), results: map[string]ruleResult{},
		rules: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "spate_conformance_rules",
			Help: "Conformance rules finished in this run, by result."}, []string{"result"})}
	reg.MustRegister(cr.rules)
	ms, err := serveMetrics(cf.metricsAddr, healthHandler(reg, cr.running.Load))
	if err != nil {
		return fail(exitFailed, "--metrics-addr: %v", err)
	}
	defer ms.stop()

	conn, err := cf.sf.connect(ctx, log, connectStart)
	if err != nil {
		return fail(exitFailed, "%v", err)
	}
	defer conn.close()
	fmt.Printf("spate conformance: %s, TTL %v\n", conn.describe, cf.ttl)

	caps, ok := conformancePreflight(ctx, conn, cf.ttl, cf.sf.connectTimeout)
	if !ok {
		return exitFailed
	}
	printCapabilities(caps)

	// The suites, in this process: the store rules, then the coordinator's.
	suites := []conformanceSuite{{"Store", conformance.StoreRules, conformance.CheckStore}}
	if cf.coord || re != nil {
		suites = append(suites, conformanceSuite{"Coordinator", conformance.CoordinatorRules, conformance.CheckCoordinator})
	}
	runCtx, cancelRun := context.WithTimeout(ctx, cf.timeout)
	defer cancelRun()
	sigs := watchSignals(func(os.Signal) { cancelRun() }, nil)
	defer sigs.stop()
	keep := conformance.Select(func(rule string) bool { return re == nil || re.MatchString(rule) })
	if err := cr.run(runCtx, suites, live.Over(conn.dep, cf.ttl), keep, cf.parallel); err != nil {
		return fail(exitFailed, "%v", err)
	}
	timedOut := errors.Is(runCtx.Err(), context.DeadlineExceeded)
	cr.mu.Lock()
	defer cr.mu.Unlock()
	return conformanceReport(suites, cr.results, start, sigs.signal(), timedOut, cf.timeout)
}

// conformanceFlags are spate conformance's flags.
type conformanceFlags struct {
	sf          storeFlags
	lf          logFlags
	coord       bool
	ttl         time.Duration
	runPat      string
	parallel    int
	timeout     time.Duration
	verbose     bool
	metricsAddr string
}

func (cf *conformanceFlags) register(fs *flag.FlagSet) {
	cf.sf.register(fs)
	cf.lf.register(fs, "warn")
	fs.BoolVar(&cf.coord, "coordinator", false, "also run the coordinator scenarios")
	fs.DurationVar(&cf.ttl, "ttl", 2*time.Second, "ephemeral TTL (the lease) the suite runs with; it must be at least the store's floor (whole seconds on etcd)")
	fs.StringVar(&cf.runPat, "run", "", "run only the rules whose Suite/Rule name matches this regexp (e.g. 'Store/Watch' or 'Coordinator/Poison'), of either suite")
	fs.IntVar(&cf.parallel, "parallel", 4, "rules run at once")
	fs.DurationVar(&cf.timeout, "timeout", 20*time.Minute, "give up on the suite after this long")
	fs.BoolVar(&cf.verbose, "v", false, "print every rule's log to stderr as it ends")
	fs.StringVar(&cf.metricsAddr, "metrics-addr", "", "serve Prometheus /metrics, /healthz and /readyz on this address")
}

func (cf *conformanceFlags) validate(pos []string) error {
	return checkFlags(
		func() error { return noPositional(pos) },
		func() error { _, err := cf.sf.validate(); return err },
		func() error { return positive("ttl", cf.ttl) },
		func() error { return atLeast("parallel", int64(cf.parallel), 1) },
		func() error { return positive("timeout", cf.timeout) },
		func() error { return checkAddr("metrics-addr", cf.metricsAddr) },
		cf.lf.validate,
	)
}

// conformanceRun is the suites' run: each rule's result as it ends, and
// whether rules are running (for /readyz).
type conformanceRun struct {
	verbose, tty bool
	rules        *prometheus.GaugeVec
	running      atomic.Bool

	mu      sync.Mutex
	results map[string]ruleResult
}

// run runs the suites in order until one cannot run (that error), every
// one is done, or ctx ends.
func (cr *conformanceRun) run(ctx context.Context, suites []conformanceSuite, mk conformance.HarnessMaker, keep conformance.Option, parallel int) error {
	cr.running.Store(true)
	defer cr.running.Store(false)
	if cr.tty {
		defer fmt.Print(clearLine)
	}
	report := conformance.OnResult(cr.onResult)
	for _, su := range suites {
		err := su.check(ctx, mk, keep, conformance.Parallel(parallel), report)
		if _, broken := errors.AsType[*conformance.RuleError](err); err != nil && !broken {
			return fmt.Errorf("%s rules: %w", su.name, err)
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil
}

func (cr *conformanceRun) onResult(r conformance.Result) {
	cr.mu.Lock()
	defer cr.mu.Unlock()
	cr.results[r.Rule] = rowOf(r)
	cr.rules.WithLabelValues(strings.ToLower(r.Status.String())).Inc()
	if cr.verbose {
		fmt.Fprintf(os.Stderr, "--- %s: %s (%.2fs)\n", r.Status, r.Rule, r.Elapsed.Seconds())
		for _, l := range r.Log {
			fmt.Fprintf(os.Stderr, "    %s\n", l)
		}
	}
	if cr.tty {
		fmt.Print(clearLine + fitWidth(fmt.Sprintf("%d rules done, last: %s %s", len(cr.results), r.Status, r.Rule), cmp.Or(terminalWidth(os.Stdout), defaultWidth)))
	}
}

// conformanceSuite is one suite that spate conformance runs.
type conformanceSuite struct {
	name  string
	rules []conformance.Rule
	check func(context.Context, conformance.HarnessMaker, ...conformance.Option) error
}

// conformancePreflight opens a store in a fresh namespace with the TTL
// the suite will run with (the driver's own startup check), and deletes
// the namespace again. When the store refuses, it prints why and the
// suite must not run.
func conformancePreflight(ctx context.Context, conn *connector, ttl, connectTimeout time.Duration) (spate.Capabilities, bool) {
	// Preflight: the store opens (its own startup check) with this TTL.
	ns := "conformance-" + randomHex()[:12]
	pctx, cancel := context.WithTimeout(ctx, connectTimeout+15*time.Second)
	st, err := conn.open(pctx, ns, ttl, connectTimeout)
	cancel()
	if err != nil {
		var u *unreachableError
		if !errors.As(err, &u) { // nothing to clean up on a store never reached
			dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
			_ = conn.dep.DeleteJob(dctx, ns)
			dcancel()
		}
		fmt.Println()
		printRuleTable(os.Stdout, []ruleResult{{name: "Preflight/StoreOpens", result: "FAIL", msgs: []string{err.Error()}}})
		fmt.Println("\nFAIL: the store refuses what spate needs; the suite did not run")
		return spate.Capabilities{}, false
	}
	caps := st.Capabilities()
	_ = st.Close()
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	_ = conn.dep.DeleteJob(dctx, ns)
	dcancel()
	return caps, true
}

// conformanceReport prints the rule table of a run, in the suites' own
// order, and its verdict, and returns the exit code.
func conformanceReport(suites []conformanceSuite, results map[string]ruleResult, start time.Time, sig os.Signal, timedOut bool, timeout time.Duration) int {
	var rows []ruleResult
	pass, failed, skip := 0, 0, 0
	for _, su := range suites {
		for _, r := range su.rules {
			row, ok := results[su.name+"/"+r.Name]
			if !ok {
				continue
			}
			rows = append(rows, row)
			switch row.result {
			case "PASS":
				pass++
			case "FAIL":
				failed++
			case "SKIP":
				skip++
			}
		}
	}
	fmt.Println()
	printRuleTable(os.Stdout, rows)
	var leftovers []string
	for _, r := range rows {
		for _, m := range r.msgs {
			if strings.Contains(m, cleanupFailed) {
				leftovers = append(leftovers, m)
			}
		}
	}
	if len(leftovers) > 0 {
		fmt.Printf("\nwarning: %d namespaces were left behind (delete their keys by hand):\n", len(leftovers))
		for _, l := range leftovers[:min(len(leftovers), 5)] {
			fmt.Println("  " + l)
		}
	}
	fmt.Printf("\n%d rules: %d passed, %d failed, %d skipped in %.1fs\n", len(rows), pass, failed, skip, time.Since(start).Seconds())
	switch {
	case sig != nil:
		fmt.Println("FAIL: interrupted")
		return signalCode(sig)
	case timedOut:
		fmt.Printf("FAIL: the suite did not finish within --timeout %v (the namespaces of unfinished rules may be left behind)\n", timeout)
		return exitFailed
	case failed > 0:
		fmt.Println("FAIL: the store broke the rules above; do not trust it with a job until they pass")
		return exitFailed
	case len(rows) == 0:
		fmt.Println("FAIL: no rule matched --run")
		return exitFailed
	}
	fmt.Println("PASS: the store keeps the contract spate relies on")
	return exitOK
}

func printCapabilities(c spate.Capabilities) {
	yes := map[bool]string{true: "yes", false: "no (fencing holds on one server; best effort across failovers)"}
	fmt.Printf("  driver %s: TTL %v (floor %v), expiry reaches watchers within %v, values up to %s\n",
		c.Driver, c.TTL, c.TTLFloor, c.ExpiryLatency, bytesStr(int64(c.MaxValueSize)))
	fmt.Printf("  compare-and-swap linearizable across failover: %s\n", yes[c.LinearizableFailover])
	if c.Durability != "" {
		fmt.Printf("  durability: %s\n", c.Durability)
	}
	for _, s := range c.RequiredSettings {
		fmt.Printf("  requires: %s\n", s)
	}
}

func printRuleTable(w io.Writer, rows []ruleResult) {
	width := len("RULE")
	for _, r := range rows {
		width = max(width, len(r.name))
	}
	fmt.Fprintf(w, "%-*s  %-6s  %s\n", width, "RULE", "RESULT", "TIME")
	for _, r := range rows {
		fmt.Fprintf(w, "%-*s  %-6s  %s\n", width, r.name, r.result, r.elapsed)
		if r.result == "FAIL" || r.result == "SKIP" {
			for i, m := range r.msgs {
				if i == 8 {
					fmt.Fprintf(w, "      ... %d more lines\n", len(r.msgs)-i)
					break
				}
				fmt.Fprintf(w, "      %s\n", m)
			}
		}
	}
}
