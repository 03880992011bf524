package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/stores/redis"
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

// Environment of the re-executed child that runs the suite under testing.
const (
	envConformanceChild  = "SPATE_CONFORMANCE_CHILD"
	envConformanceConfig = "SPATE_CONFORMANCE_CONFIG"
)

// childConfig is what the parent tells the child about the store.
type childConfig struct {
	URL, DataDir, EmbedAddr      string
	CAFile, CertFile, KeyFile    string
	User, Password, Token, Creds string
	PasswordFile, TokenFile      string
	TTL                          time.Duration
	ConnectTimeout               time.Duration
}

func (c childConfig) storeFlags() storeFlags {
	return storeFlags{url: c.URL, dataDir: c.DataDir, embedAddr: c.EmbedAddr, caFile: c.CAFile, certFile: c.CertFile,
		keyFile: c.KeyFile, user: c.User, password: c.Password, token: c.Token, creds: c.Creds,
		passwordFile: c.PasswordFile, tokenFile: c.TokenFile,
		connectTimeout: cmp.Or(c.ConnectTimeout, 10*time.Second)}
}

func isConformanceChild() bool { return os.Getenv(envConformanceChild) == "1" }

// runConformanceChild runs the suite as a test binary would: testing.Main
// parses the -test.* flags the parent passed and exits.
func runConformanceChild() {
	var cfg childConfig
	if err := json.Unmarshal([]byte(os.Getenv(envConformanceConfig)), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "spate conformance child: bad config: %v\n", err)
		os.Exit(exitFailed)
	}
	sf := cfg.storeFlags()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	redis.RouteClientLogs(log)
	conn, err := sf.connect(context.Background(), log, connectStart)
	if err != nil {
		fmt.Fprintf(os.Stderr, "spate conformance child: %v\n", err)
		os.Exit(exitFailed)
	}
	mk := func(t testing.TB) conformance.Harness {
		h := &cliHarness{t: t, conn: conn, ns: "conformance-" + spate.RandomHex()[:12], ttl: cfg.TTL}
		t.Cleanup(func() { _ = h.Close() })
		return h
	}
	tests := []testing.InternalTest{
		{Name: "Store", F: func(t *testing.T) { conformance.RunStore(t, mk) }},
		{Name: "Coordinator", F: func(t *testing.T) { conformance.RunCoordinator(t, mk) }},
	}
	testing.Main(regexp.MatchString, tests, nil, nil)
}

// cliHarness is a conformance harness over one namespace of the store.
type cliHarness struct {
	t    testing.TB
	conn *connector
	ns   string
	ttl  time.Duration

	mu     sync.Mutex
	stores []spate.Store
	closed bool
}

func (h *cliHarness) NewStore(ctx context.Context) (spate.Store, error) {
	st, err := h.conn.dep.Open(ctx, h.ns, h.ttl)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.stores = append(h.stores, st)
	h.mu.Unlock()
	return st, nil
}

// Close closes the stores left open and deletes the namespace. Idempotent.
func (h *cliHarness) Close() error {
	h.mu.Lock()
	stores := h.stores
	h.stores = nil
	done := h.closed
	h.closed = true
	h.mu.Unlock()
	for _, st := range stores {
		_ = st.Close()
	}
	if done {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := h.conn.dep.DeleteJob(ctx, h.ns)
	if err != nil {
		h.t.Logf("%s namespace %s: %v", cleanupFailed, h.ns, err)
	}
	return err
}

// cleanupFailed marks the log line of a namespace the harness could not
// delete; the parent collects them.
const cleanupFailed = "cleanup: could not delete"

// ruleResult is one rule's outcome as the child's -test.v output reports it.
type ruleResult struct {
	name    string
	result  string // PASS, FAIL, SKIP
	elapsed string
	msgs    []string
}

var (
	resultLine = regexp.MustCompile(`^--- (PASS|FAIL|SKIP): (\S+) \(([^)]*)\)`)
	headerLine = regexp.MustCompile(`^=== (?:RUN|PAUSE|CONT|NAME)\s+(\S+)`)
)

// parseTestOutput reads -test.v output, calling onResult as each test ends.
func parseTestOutput(r io.Reader, onResult func(ruleResult)) (map[string]*ruleResult, []string) {
	results := map[string]*ruleResult{}
	msgs := map[string][]string{}
	var other []string
	current := ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		raw := sc.Text()
		line := strings.TrimSpace(raw)
		if m := headerLine.FindStringSubmatch(line); m != nil {
			current = m[1]
			continue
		}
		if m := resultLine.FindStringSubmatch(line); m != nil {
			rr := &ruleResult{name: m[2], result: m[1], elapsed: m[3]}
			results[rr.name] = rr
			current = rr.name
			onResult(*rr)
			continue
		}
		if line == "" || line == "PASS" || line == "FAIL" || strings.HasPrefix(line, "ok ") {
			continue
		}
		if strings.HasPrefix(raw, " ") && current != "" {
			msgs[current] = append(msgs[current], line)
			continue
		}
		other = append(other, raw)
	}
	for name, m := range msgs {
		if rr := results[name]; rr != nil {
			rr.msgs = m
		} else if len(m) > 0 {
			other = append(other, m...)
		}
	}
	return results, other
}

func runConformance(args []string) int {
	fs := newFlagSet("conformance", "--store URL [--coordinator] [flags]", conformanceAbout)
	var sf storeFlags
	var lf logFlags
	sf.register(fs)
	lf.register(fs, "warn")
	coord := fs.Bool("coordinator", false, "also run the coordinator scenarios")
	ttl := fs.Duration("ttl", 2*time.Second, "ephemeral TTL (the lease) the suite runs with; it must be at least the store's floor (whole seconds on etcd)")
	runPat := fs.String("run", "", "run only the rules matching this regexp, as go test -run does (e.g. 'Store/Watch' or 'Coordinator/Poison')")
	parallel := fs.Int("parallel", 4, "rules run at once")
	timeout := fs.Duration("timeout", 20*time.Minute, "give up on the suite after this long")
	verbose := fs.Bool("v", false, "print the suite's own output too")
	metricsAddr := fs.String("metrics-addr", "", "serve Prometheus /metrics, /healthz and /readyz on this address")
	pos, code, ok := parseArgs(fs, args)
	if !ok {
		return code
	}
	if err := checkFlags(
		func() error { return noPositional(pos) },
		func() error { _, err := sf.validate(); return err },
		func() error { return positive("ttl", *ttl) },
		func() error { return atLeast("parallel", int64(*parallel), 1) },
		func() error { return positive("timeout", *timeout) },
		func() error { return checkAddr("metrics-addr", *metricsAddr) },
		lf.validate,
	); err != nil {
		return usageError(fs, "%v", err)
	}
	log, err := lf.logger(os.Stderr)
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	start := time.Now()
	ctx := context.Background()

	reg := newRegistry()
	rules := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "spate_conformance_rules",
		Help: "Conformance rules finished in this run, by result."}, []string{"result"})
	reg.MustRegister(rules)
	var running atomic.Bool
	ms, err := serveMetrics(*metricsAddr, healthHandler(reg, running.Load))
	if err != nil {
		return fail(exitFailed, "--metrics-addr: %v", err)
	}
	defer ms.stop()

	conn, err := sf.connect(ctx, log, connectStart)
	if err != nil {
		return fail(exitFailed, "%v", err)
	}
	defer conn.close()
	fmt.Printf("spate conformance: %s, TTL %v\n", conn.describe, *ttl)

	// Preflight: the store opens (its own startup check) with this TTL.
	ns := "conformance-" + spate.RandomHex()[:12]
	pctx, cancel := context.WithTimeout(ctx, sf.connectTimeout+15*time.Second)
	st, err := conn.open(pctx, ns, *ttl, sf.connectTimeout)
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
		return exitFailed
	}
	caps := st.Capabilities()
	_ = st.Close()
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	_ = conn.dep.DeleteJob(dctx, ns)
	dcancel()
	printCapabilities(caps)

	// The suite, in a child process of this binary running as a test binary.
	pattern := *runPat
	if pattern == "" {
		pattern = "^Store$"
		if *coord {
			pattern = "^(Store|Coordinator)$"
		}
	}
	cfgJSON, _ := json.Marshal(childConfig{URL: sf.url, DataDir: sf.dataDir, EmbedAddr: sf.embedAddr, CAFile: sf.caFile,
		CertFile: sf.certFile, KeyFile: sf.keyFile, User: sf.user, Password: sf.password, Token: sf.token, Creds: sf.creds,
		PasswordFile: sf.passwordFile, TokenFile: sf.tokenFile, TTL: *ttl,
		ConnectTimeout: sf.connectTimeout})
	exe, err := os.Executable()
	if err != nil {
		return fail(exitFailed, "find this binary: %v", err)
	}
	cmd := exec.Command(exe, "-test.v", "-test.count=1", "-test.run", pattern,
		"-test.parallel", strconv.Itoa(*parallel), "-test.timeout", timeout.String())
	cmd.Env = append(os.Environ(), envConformanceChild+"=1", envConformanceConfig+"="+string(cfgJSON))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fail(exitFailed, "%v", err)
	}
	setDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		return fail(exitFailed, "start the suite: %v", err)
	}
	running.Store(true)
	sigs := watchSignals(func(os.Signal) { _ = cmd.Process.Kill() }, nil)
	defer sigs.stop()
	tty := isTerminal(os.Stdout)
	var src io.Reader = out
	if *verbose {
		src = io.TeeReader(out, os.Stderr)
	}
	done := 0
	results, other := parseTestOutput(src, func(r ruleResult) {
		if !strings.Contains(r.name, "/") {
			return
		}
		done++
		rules.WithLabelValues(strings.ToLower(r.result)).Inc()
		if tty {
			fmt.Print(clearLine + fitWidth(fmt.Sprintf("%d rules done, last: %s %s", done, r.result, r.name), cmp.Or(terminalWidth(os.Stdout), defaultWidth)))
		}
	})
	waitErr := cmd.Wait()
	running.Store(false)
	if tty {
		fmt.Print(clearLine)
	}

	// The table, in the suite's own order.
	var order []string
	for _, r := range conformance.StoreRules {
		order = append(order, "Store/"+r)
	}
	for _, r := range conformance.CoordinatorRules {
		order = append(order, "Coordinator/"+r)
	}
	var rows []ruleResult
	pass, failed, skip := 0, 0, 0
	add := func(r *ruleResult) {
		rows = append(rows, *r)
		switch r.result {
		case "PASS":
			pass++
		case "FAIL":
			failed++
		case "SKIP":
			skip++
		}
	}
	for _, name := range order {
		if r := results[name]; r != nil {
			add(r)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(results)) {
		if strings.Contains(name, "/") && !slices.Contains(order, name) {
			add(results[name])
		}
	}
	fmt.Println()
	printRuleTable(os.Stdout, rows)
	var leftovers []string
	for _, r := range results {
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
	case sigs.signal() != nil:
		fmt.Println("FAIL: interrupted")
		return signalCode(sigs.signal())
	case failed > 0:
		fmt.Println("FAIL: the store broke the rules above; do not trust it with a job until they pass")
		return exitFailed
	case waitErr != nil || len(rows) == 0:
		fmt.Printf("FAIL: the suite did not finish cleanly (%v)\n", waitErr)
		for _, l := range other[max(0, len(other)-30):] {
			fmt.Println("  " + l)
		}
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
