package conformance

import (
	"flag"
	"fmt"
	"go/ast"
	"go/doc/comment"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the traceability table, "+traceFile)

// traceFile is the traceability table: every sentence of the store
// contract with the rules that check it.
const traceFile = "../docs/conformance-traceability.md"

// alsoChecks names, for a sentence of the contract, rules that check it
// although they quote another sentence: the sentence restates or sums up
// the one they quote.
var alsoChecks = map[string][]string{
	"Retryable: timeouts, transport failures, a cancelled or expired context, a broken or lagged watch.": {"LaggingWatcherConvergesOrBreaksRetryable"},
	"Fatal: misconfiguration, unsupported server, authentication failure, a keyspace other than [Durable] and [Ephemeral], a value over the size cap ([ErrValueTooLarge]), an invalid key ([ErrInvalidKey]), use after Close ([ErrClosed]).": {
		"InvalidKeysRejected", "ValueSizeCap", "UseAfterClose"},
	"Nothing was written.": {"InvalidKeysRejected", "ValueSizeCap", "InvalidKeyspacesAreFatal"},
	"Capabilities reports what the driver promises.": {"DriverIsNamed", "TTLIsFixedWhenOpened", "TTLFloorIsAtMostTheTTL",
		"ValueCapIsReported", "ExpiryReachesWatchersWithinTheLatency"},
	"Delete removes key.": {"GuardedDelete", "UnconditionalDeleteWinsEvenWhenAbsent"},
	"Close releases the driver's resources; see the type documentation.": {"CloseEndsEveryWatchAndIsIdempotent", "UseAfterClose"},
	"Durable keys never expire.":                                         {"DurableKeysNeverExpire"},
	"Ephemeral keys expire one TTL after their last write.": {"EphemeralKeyLivesItsWholeTTL", "ExpiredKeysReadAbsentAndAreRecreatable",
		"UpdatedEphemeralKeyExpiresAfterItsTTL", "LostUpdateDoesNotRearmTheTTL"},
	"AnyRevision as the expected revision of [Store.Delete] makes the delete unconditional.": {"UnconditionalDeleteWinsEvenWhenAbsent"},
	"Entry is one live key.":                                                                                 {"ListReturnsLiveKeys", "DeletedKeysReadAbsentAndAreRecreatable"},
	"WatchDelete: Key was deleted or expired at Revision.":                                                   {"WatchDeliversDeletes", "ExpiryReachesWatchersAsDelete"},
	"WatchSnapshotDone: every key live when the watch began has been delivered.":                             {"WatchSnapshotThenOneSnapshotDone", "WatchHasNoGaps"},
	"WatchError: the stream broke; Err says why.":                                                            {"LaggingWatcherConvergesOrBreaksRetryable"},
	"It is the last event.":                                                                                  {"LaggingWatcherConvergesOrBreaksRetryable"},
	"KeyMaxLen is the maximum store key length in bytes.":                                                    {"ValidKeysAreAccepted", "InvalidKeysRejected"},
	"Every error spate returns satisfies errors.Is with exactly one of ErrFenced, ErrRetryable or ErrFatal.": {"ErrorsAreRetryableOrFatal"},
	"Callers intercept it and treat the split as lost; it is never produced by a store.":                     {"ErrorsAreRetryableOrFatal"},
	"ErrRetryable: a transient failure (timeout, transport error, broken or lagged watch, cancelled context).": {
		"CancelledContextIsRetryable", "LaggingWatcherConvergesOrBreaksRetryable"},
	"ErrFatal: unrecoverable (misconfiguration, a store without the required atomic primitives, a corrupt or alien record, a diverging job fingerprint, an unsupported server version).": {
		"InvalidKeyspacesAreFatal", "InvalidKeysRejected", "ValueSizeCap", "UseAfterClose"},
	"Each is returned wrapped together with its class, so errors.Is matches both.":                                           {"InvalidKeysRejected", "ValueSizeCap", "UseAfterClose"},
	"ErrClosed is returned (with ErrFatal) by every call after Close but Close itself, which is idempotent.":                 {"UseAfterClose", "CloseEndsEveryWatchAndIsIdempotent"},
	"UpdateAndDelete reports whether the store has the optional [Releaser] capability.":                                      {"ReleaserIsReported"},
	"driver.NewStore sets it when its Driver implements Releaser, and a wrapper that does not pass the method on clears it.": {"ReleaserIsReported"},
	"Releaser is the optional capability of a store that updates a durable key and deletes an ephemeral key in one atomic call.": {
		"ReleaseUpdatesAndDeletes", "ReleaseIsSeenAtOnce"},
	"MaxWatchKeys is the most keys one [KeyWatcher.WatchKeys] call watches.": {"WatchKeysArgumentsAreChecked"},
	"KeyWatcher is the optional capability of a store that watches a set of exact keys, natively: the store sends a watcher the changes of its keys only, so what a watcher receives grows with the keys it watches, not with the writes to the whole keyspace.": {
		"WatchKeysDeliversOnlyListedKeys"},
	"The rules of [Store.Watch] hold for each listed key: no gaps (the watcher's view of the listed keys converges to the store's, across the boundary between snapshot and live stream too), duplicates allowed across that boundary, superseded revisions may be coalesced, the latest revision of every key is delivered, and one key's events arrive in revision order.": {
		"WatchKeysDeliversPutsDeletesAndExpiry"},
	"Sessioner is the optional capability of a store whose ephemeral keys can share one lifetime, renewed by one call that writes no key: a worker holding N splits keeps their leases with one [Session.KeepAlive] per beat instead of N updates, and no watcher receives a renewal.": {
		"SessionKeysLiveWhileKeptAlive", "KeepAliveWritesNothing"},
	"NewSession starts a session whose lifetime is the store's TTL ([Capabilities.TTL]), counted from this call.": {"ExpiredSessionFails"},
	"Session is a lifetime that ephemeral keys share.":                                                            {"SessionKeysLiveWhileKeptAlive"},
	"Store.Delete, Get, List and Watch treat bound keys as any ephemeral key.":                                    {"SessionKeysLiveWhileKeptAlive", "KeepAliveWritesNothing", "SessionCloseDeletesItsKeys"},
	"Update is [Store.Update] in the [Ephemeral] keyspace, the key bound to the session (whatever it was bound to before).": {
		"SessionCreateAndUpdateAreFenced"},
	"KeepAlive renews the session: when it returns nil, every key bound to it lives until at least one TTL after KeepAlive was called.": {
		"SessionKeysLiveWhileKeptAlive"},
	"It is idempotent; after it every other call fails with an error matching [ErrClosed] and [ErrFatal].": {"SessionCloseDeletesItsKeys"},
	"ErrSessionExpired is returned (with ErrFatal) by every call on a [Session] that expired: no KeepAlive reached the store for a TTL, and the keys bound to it are gone.": {
		"ExpiredSessionFails"},
}

// unchecked says, for a sentence no rule checks, why none can.
var unchecked = map[string]string{
	"Store is the contract every coordination store driver implements: six primitives over two keyspaces.":                                                                        "it introduces the interface; the compiler checks the six primitives.",
	"A write that fails Retryable may have landed; the caller re-reads to find out.":                                                                                              "it permits and instructs the caller; a driver cannot break it.",
	"Drivers make one attempt per call; retries live in the coordinator.":                                                                                                         "the suite cannot put a transient failure between a driver and its server, so it cannot count attempts.",
	"A driver that must make an exception for correctness says so, and why, in its package documentation.":                                                                        "it binds a driver's documentation.",
	"A call in flight when Close begins has its context cancelled, and Close waits for it to return before it closes the backend, so that no call reaches a backend after Close.": "the suite sees the Store, not the backend behind it; the root's TestPortableCloseCancelsAndWaitsForCallsInFlight and TestPortableCloseRacingCalls check it with a counting Driver.",
	"Every driver is a [github.com/spate-go/spate/driver.Driver] wrapped by driver.NewStore, whose PortableStore holds, once for all drivers, the closed state, the tracking of calls in flight, the argument checks, the value cap, the revision-0 rule of Update and the error format (driver.OpError); the driver does the backend's part and classifies its own errors.": "it describes how drivers are built, not what a store does; the root's TestPortable tests check the PortableStore.",
	"See [ValidateKey].": "a reference.",
	"A coordinator on a store with it watches only the keys that concern it (so that a worker's work grows with its own splits); on a store without it, every worker watches the whole job.": "it describes the coordinator, not a store; the root's TestANonLeaderWatchesOnlyItsOwnKeys checks it.",
	"Find it with [KeyWatcherOf].":                          "a reference.",
	"Events of different keys may interleave in any order.": "it permits; a driver cannot break it.",
	"expected must be a revision read from a live value (a create, update, get, listing or put event); an Update at the revision of a delete is undefined (some stores cannot tell a delete marker from a value).": "it binds the caller, and leaves undefined what it excludes.",
	"Outcome is the result of a conditional write.":                                                      "it introduces the type.",
	"The zero Outcome is Lost.":                                                                          "a property of the Go type, not of a driver.",
	"WatchEventKind tells the watch events apart.":                                                       "it introduces the type.",
	"WatchEvent is one item of a watch stream.":                                                          "it introduces the type.",
	"Capabilities is what a driver reports about itself.":                                                "it introduces the type.",
	"LinearizableFailover reports whether compare-and-swap stays linearizable when a server fails over.": "a claim about failovers; the store rules run on a healthy server (RunFailover and RunChaos fail servers, and check the coordinator's guarantees).",
	"When false, fencing holds on a single server only and is best effort across failovers.":             "it explains the claim above.",
	"Durability says, in words, what survives a server crash.":                                           "free text for people.",
	"RequiredSettings lists server settings the guarantees depend on.":                                   "free text for people.",
	"UnmetSettings lists the required settings the driver checked when the store was opened and found unmet, or could not verify, each with what the server has instead.":                             "the suite cannot see a server's settings; each driver's own tests check what it reports (stores/redis TestPersistenceSettingsAreCheckedAtStartup).",
	"Empty means none found unmet (a driver that checks nothing reports none).":                                                                                                                       "it defines the empty report, which RequiredSettingsAreMet accepts.",
	"ErrUnreadableRecord is returned (with ErrFatal) for a record of the job that cannot be read: corrupt bytes, an unknown schema, an id that does not match its key, or another job's fingerprint.": "the coordinator's error about the job's records; a store never returns it (the coordinator rule DamagedRecordTakesOnlyItsSplitOutOfPlay checks what follows).",
	"A coordinator takes only the split it belongs to out of play.":                                                                                                                                   "a coordinator rule: DamagedRecordTakesOnlyItsSplitOutOfPlay.",
	"The error classes.": "a heading.",
	"Never match error strings; use errors.Is, or [IsRetryable], [IsFenced] and [IsFatal].":              "it binds the caller.",
	"ErrFenced: a fenced write lost, so this instance no longer owns the split and nothing was written.": "the coordinator's error; that a store never returns it is the next sentence.",
	"A write that fails Retryable MAY HAVE LANDED: the reply, not necessarily the write, was lost.":      "it permits; a driver cannot break it.",
	"Re-read before assuming either way.": "it binds the caller.",
	"The pipeline must stop.":             "it binds the caller.",
	"Refinements of the classes above.":   "a heading.",
	"The coordinator hands a split back with it in one round trip (the owner cleared from the split's progress record, its lease deleted) and in two calls, Update then Delete, on a store without it.": "the coordinator's use of it; the root's TestStoreCallsPerLifecycle and scale.MeasureLifecycle (every driver's TestStoreCallsPerLifecycle) count the calls.",
	"Find it with [ReleaserOf].": "a reference.",
	"A call that fails Retryable landed both writes or neither, never one alone.":                                          "the suite cannot lose a reply between a driver and its server; ReleaseIsSeenAtOnce checks that the two writes are one.",
	"A coordinator on a store with it binds its split leases to a session; on a store without it, it rewrites each lease.": "the coordinator's use of it.",
	"Find it with [SessionerOf].": "a reference.",
	"Start a new session.":        "it binds the caller.",
}

// sentence is one sentence of the contract and where it stands.
type sentence struct {
	where, text string
}

// contract returns the sentences of the store contract, in order: the
// documentation of store.go's types, their methods and fields, constants
// and variables, and of errors.go's error classes and refinements.
func contract(t *testing.T) []sentence {
	t.Helper()
	var out []sentence
	fset := token.NewFileSet()
	for _, file := range []string{"../store.go", "../errors.go"} {
		f, err := parser.ParseFile(fset, file, nil, parser.ParseComments)
		require.NoError(t, err)
		blocks := 0
		emit := func(where string, cg *ast.CommentGroup) {
			if cg == nil {
				return
			}
			for _, s := range sentences(cg.Text()) {
				out = append(out, sentence{where, s})
			}
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok == token.IMPORT {
				continue
			}
			if file == "../errors.go" {
				// The error classes and their refinements: the two var
				// blocks that open the file.
				if gd.Tok != token.VAR || blocks == 2 {
					continue
				}
				blocks++
			}
			if gd.Lparen.IsValid() && file == "../errors.go" {
				emit([]string{"", "The error classes (errors.go)", "Their refinements (errors.go)"}[blocks], gd.Doc)
			}
			for _, sp := range gd.Specs {
				switch sp := sp.(type) {
				case *ast.TypeSpec:
					doc := sp.Doc
					if doc == nil {
						doc = gd.Doc
					}
					emit(sp.Name.Name, doc)
					switch ty := sp.Type.(type) {
					case *ast.InterfaceType:
						for _, m := range ty.Methods.List {
							emit(sp.Name.Name+"."+m.Names[0].Name, m.Doc)
						}
					case *ast.StructType:
						for _, fld := range ty.Fields.List {
							if len(fld.Names) > 0 {
								emit(sp.Name.Name+"."+fld.Names[0].Name, fld.Doc)
							}
						}
					}
				case *ast.ValueSpec:
					doc := sp.Doc
					if doc == nil && !gd.Lparen.IsValid() {
						doc = gd.Doc
					}
					emit(sp.Names[0].Name, doc)
				}
			}
		}
	}
	return out
}

// sentences splits a doc comment into sentences: its paragraphs and list
// items, code blocks left out, cut after '.', '?' or '!' (and closing
// quotes or parentheses) followed by a space.
func sentences(text string) []string {
	var p comment.Parser
	var out []string
	var flat func(b *strings.Builder, ts []comment.Text)
	flat = func(b *strings.Builder, ts []comment.Text) {
		for _, t := range ts {
			switch t := t.(type) {
			case comment.Plain:
				b.WriteString(string(t))
			case comment.Italic:
				b.WriteString(string(t))
			case *comment.Link:
				flat(b, t.Text)
			case *comment.DocLink:
				b.WriteString("[")
				flat(b, t.Text)
				b.WriteString("]")
			}
		}
	}
	var walk func(blocks []comment.Block)
	walk = func(blocks []comment.Block) {
		for _, bl := range blocks {
			switch bl := bl.(type) {
			case *comment.Paragraph:
				var b strings.Builder
				flat(&b, bl.Text)
				out = append(out, split(strings.Join(strings.Fields(b.String()), " "))...)
			case *comment.List:
				for _, it := range bl.Items {
					walk(it.Content)
				}
			}
		}
	}
	walk(p.Parse(text).Content)
	return out
}

func split(s string) []string {
	var out []string
	start := 0
	for i := 1; i+1 < len(s); i++ {
		if s[i] != ' ' {
			continue
		}
		j := i - 1
		for j > start && (s[j] == ')' || s[j] == '"') {
			j--
		}
		if s[j] == '.' || s[j] == '?' || s[j] == '!' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// rulesOf maps each sentence to the rules that check it.
func rulesOf() map[string][]string {
	m := map[string][]string{}
	for _, r := range StoreRules {
		m[r.Contract] = append(m[r.Contract], r.Name)
	}
	for s, rules := range alsoChecks {
		for _, r := range rules {
			if !slices.Contains(m[s], r) {
				m[s] = append(m[s], r)
			}
		}
	}
	return m
}

// TestTraceability: every store rule quotes a sentence of the contract;
// every sentence of the contract is checked by a rule or says why none can;
// the traceability table (traceFile) lists them all as they stand.
func TestTraceability(t *testing.T) {
	sents := contract(t)
	texts := map[string]bool{}
	for _, s := range sents {
		texts[s.text] = true
	}
	for _, r := range StoreRules {
		assert.True(t, texts[r.Contract], "rule %s quotes a sentence that is not in the contract: %q", r.Name, r.Contract)
	}
	names := names(StoreRules)
	for s, rules := range alsoChecks {
		assert.True(t, texts[s], "alsoChecks holds a sentence that is not in the contract: %q", s)
		for _, r := range rules {
			assert.Contains(t, names, r, "alsoChecks names no rule %s", r)
		}
	}
	for s := range unchecked {
		assert.True(t, texts[s], "unchecked holds a sentence that is not in the contract: %q", s)
	}
	checks := rulesOf()
	for _, s := range sents {
		if _, exempt := unchecked[s.text]; exempt {
			assert.Empty(t, checks[s.text], "%q is both checked and said to be uncheckable", s.text)
			continue
		}
		assert.NotEmpty(t, checks[s.text], "%s: no rule checks %q, and unchecked does not say why none can", s.where, s.text)
	}

	table := traceTable(sents, checks)
	if *update {
		require.NoError(t, os.WriteFile(traceFile, []byte(table), 0o644))
		return
	}
	raw, err := os.ReadFile(traceFile)
	require.NoError(t, err, "the traceability table; go test -run TestTraceability -update ./conformance/ writes it")
	assert.Equal(t, table, string(raw), "%s is stale; run go test -run TestTraceability -update ./conformance/", traceFile)
}

var docLink = regexp.MustCompile(`\[([A-Z]\w*(?:\.\w+)?)\]`)

// traceTable renders the traceability table, a Markdown page.
func traceTable(sents []sentence, checks map[string][]string) string {
	checked, restated, exempt := 0, 0, 0
	quoted := map[string]bool{}
	for _, r := range StoreRules {
		quoted[r.Contract] = true
	}
	for _, s := range sents {
		switch {
		case quoted[s.text]:
			checked++
		case len(checks[s.text]) > 0:
			restated++
		default:
			exempt++
		}
	}
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("# The store contract, sentence by sentence")
	w("")
	w("<!-- Generated by go test -run TestTraceability -update ./conformance/ (conformance/trace_test.go); do not edit. -->")
	w("")
	w("Each store rule of the conformance suite checks one sentence of the store")
	w("contract: the documentation of `spate.Store`, its methods and types, and of")
	w("the error classes in errors.go. Below is every sentence of that contract, in")
	w("its order, with the rules that check it. Of its %d sentences, %d are quoted", len(sents), checked)
	w("by the %d rules of `conformance.StoreRules`, %d restate or sum up sentences", len(StoreRules), restated)
	w("whose rules check them too, and %d no rule can check, for the reason given.", exempt)
	w("A test (`TestTraceability`) keeps this list, the contract and the rules in")
	w("step.")
	where := ""
	for _, s := range sents {
		if s.where != where {
			where = s.where
			w("")
			w("## %s", where)
			w("")
		}
		text := docLink.ReplaceAllString(s.text, "`spate.$1`")
		if rules := checks[s.text]; len(rules) > 0 {
			w("- %s — checked by %s.", text, strings.Join(rules, ", "))
		} else {
			w("- %s — no rule: %s", text, unchecked[s.text])
		}
	}
	return b.String()
}
