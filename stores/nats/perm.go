package nats

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"sync"

	natsgo "github.com/nats-io/nats.go"

	"github.com/spate-go/spate"
)

// Permissions returns the subjects a NATS user needs to run job: what it
// must be allowed to publish to and to subscribe to. The package
// documentation shows them as a server configuration. The subscribe list
// assumes nats.go's default inbox prefix (_INBOX); a connection made with
// nats.CustomInboxPrefix needs "<prefix>.>" instead.
//
// Every subject is one the driver (through nats.go's jetstream package)
// sends to: $JS.API.INFO when it opens, STREAM.INFO and STREAM.CREATE to
// adopt or create the buckets' streams, STREAM.MSG.GET for reads (direct
// get is off), CONSUMER.CREATE, CONSUMER.MSG.NEXT and CONSUMER.DELETE for
// the ordered consumers behind watches (the last when one is reset),
// CONSUMER.INFO for a watch's checks of its consumer (see
// [WatchStallBound]), and the buckets' own subjects for writes. Every
// reply comes back on an inbox.
//
// CONSUMER.INFO is the one a user may lack: its watches then run without
// those checks (a consumer that stops delivering leaves them silent rather
// than broken), and the first refused check logs a warning that names it.
func Permissions(job string) (publish, subscribe []string) {
	durable, ephemeral := Buckets(job)
	publish = []string{"$JS.API.INFO"}
	for _, b := range []string{durable, ephemeral} {
		st := "KV_" + b
		publish = append(publish,
			"$JS.API.STREAM.INFO."+st,
			"$JS.API.STREAM.CREATE."+st,
			"$JS.API.STREAM.MSG.GET."+st,
			"$JS.API.CONSUMER.CREATE."+st+".>",
			"$JS.API.CONSUMER.MSG.NEXT."+st+".*",
			"$JS.API.CONSUMER.DELETE."+st+".*",
			"$JS.API.CONSUMER.INFO."+st+".*",
			"$KV."+b+".>",
		)
	}
	return publish, []string{"_INBOX.>"}
}

// nats.go reports a permission violation only to the connection's
// asynchronous error handler (and as its LastError): the request that
// needed the permission just never gets an answer and times out. The driver
// therefore chains a handler of its own in front of the connection's and
// cancels the calls in flight, with an error that names the permission,
// when the server refuses a subject of the store's.

// violationRe parses the server's "Permissions Violation for Publish to
// "subj"" and "... for Subscription to "subj"" (nats.go keeps the text).
var violationRe = regexp.MustCompile(`(?i)permissions violation for (publish|subscription) to "([^"]+)"`)

// violation is one refused subject.
type violation struct {
	subscribe bool
	subject   string
	err       error
}

func parseViolation(err error) (violation, bool) {
	if err == nil || !errors.Is(err, natsgo.ErrPermissionViolation) {
		return violation{}, false
	}
	m := violationRe.FindStringSubmatch(err.Error())
	if m == nil {
		return violation{}, false
	}
	return violation{subscribe: strings.EqualFold(m[1], "subscription"), subject: m[2], err: err}, true
}

// permWatch fans a connection's permission violations out to the calls in
// flight.
type permWatch struct {
	mu   sync.Mutex
	next uint64
	subs map[uint64]func(violation)
}

var permWatches = struct {
	sync.Mutex
	m map[*natsgo.Conn]*permWatch
}{m: map[*natsgo.Conn]*permWatch{}}

// chainPermHandler makes the error handler the driver installs, every one
// from the same literal, which lets watchPermissions recognise it by its
// code pointer. Inlined, the literal would get a copy per call site.
//
//go:noinline
func chainPermHandler(w *permWatch, prev natsgo.ErrHandler) natsgo.ErrHandler {
	return func(nc *natsgo.Conn, sub *natsgo.Subscription, err error) {
		if v, ok := parseViolation(err); ok {
			w.report(v)
		}
		if prev != nil {
			prev(nc, sub, err)
		}
	}
}

var permHandlerPC = reflect.ValueOf(chainPermHandler(nil, nil)).Pointer()

// watchPermissions returns nc's permWatch, installing the driver's error
// handler in front of the connection's current one if it is not there
// (again): a caller that replaces the handler after New loses the fast
// permission errors until the next store opens on the connection.
func watchPermissions(nc *natsgo.Conn) *permWatch {
	permWatches.Lock()
	defer permWatches.Unlock()
	prev := nc.ErrorHandler()
	if w := permWatches.m[nc]; w != nil && prev != nil && reflect.ValueOf(prev).Pointer() == permHandlerPC {
		return w
	}
	for c := range permWatches.m {
		if c.IsClosed() {
			delete(permWatches.m, c)
		}
	}
	w := permWatches.m[nc]
	if w == nil {
		w = &permWatch{subs: map[uint64]func(violation){}}
		permWatches.m[nc] = w
	}
	nc.SetErrorHandler(chainPermHandler(w, prev))
	return w
}

func (w *permWatch) report(v violation) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, f := range w.subs {
		f(v)
	}
}

func (w *permWatch) add(f func(violation)) (remove func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	id := w.next
	w.next++
	w.subs[id] = f
	return func() {
		w.mu.Lock()
		delete(w.subs, id)
		w.mu.Unlock()
	}
}

// permScope is the set of subjects one store uses, to tell its violations
// from those of other users of the connection.
type permScope struct {
	job         string
	inboxPrefix string   // "_INBOX."
	streams     []string // "KV_<bucket>"
	buckets     []string // "$KV.<bucket>."
}

func newPermScope(nc *natsgo.Conn, job string) permScope {
	inbox := nc.NewInbox()
	d, e := Buckets(job)
	return permScope{
		job:         job,
		inboxPrefix: inbox[:strings.LastIndexByte(inbox, '.')+1],
		streams:     []string{"KV_" + d, "KV_" + e},
		buckets:     []string{"$KV." + d + ".", "$KV." + e + "."},
	}
}

// owns reports whether the refused subject is one of the store's calls
// need. CONSUMER.INFO is not: only a watch's guard asks it, and a refusal
// turns the guard off (see probeDenied).
func (p permScope) owns(v violation) bool {
	subj := v.subject
	if strings.HasPrefix(subj, consumerInfoAPI) {
		return false
	}
	if strings.HasPrefix(subj, p.inboxPrefix) || subj == "$JS.API.INFO" {
		return true
	}
	for _, b := range p.buckets {
		if strings.HasPrefix(subj, b) {
			return true
		}
	}
	if rest, ok := strings.CutPrefix(subj, "$JS.API."); ok {
		for _, st := range p.streams {
			if strings.Contains("."+rest+".", "."+st+".") {
				return true
			}
		}
	}
	return false
}

// consumerInfoAPI prefixes the subjects a watch's guard asks.
const consumerInfoAPI = "$JS.API.CONSUMER.INFO."

// probeDenied reports whether the refused subject is a guard's request
// about a consumer of bucket b.
func (p permScope) probeDenied(v violation, b *bucket) bool {
	return !v.subscribe && strings.HasPrefix(v.subject, consumerInfoAPI+"KV_"+b.name+".")
}

// watchOwns reports whether the refused subject is one a running watch of
// bucket b needs: its consumer's pull requests and re-creation, or inboxes.
func (p permScope) watchOwns(v violation, b *bucket) bool {
	st := "KV_" + b.name + "."
	return strings.HasPrefix(v.subject, p.inboxPrefix) ||
		strings.HasPrefix(v.subject, "$JS.API.CONSUMER.MSG.NEXT."+st) ||
		strings.HasPrefix(v.subject, "$JS.API.CONSUMER.CREATE."+st)
}

// needed names the entry of the permission list that covers the refused
// subject.
func (p permScope) needed(v violation) string {
	if v.subscribe {
		if strings.HasPrefix(v.subject, p.inboxPrefix) {
			return p.inboxPrefix + ">"
		}
		return v.subject
	}
	pub, _ := Permissions(p.job)
	for _, pat := range pub {
		if subjectMatches(pat, v.subject) {
			return pat
		}
	}
	return v.subject
}

// subjectMatches reports whether subject (which may itself hold
// wildcards, as a consumer-create subject does) falls under pattern.
func subjectMatches(pattern, subject string) bool {
	pt, st := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, t := range pt {
		if t == ">" {
			return len(st) > i
		}
		if i >= len(st) || (t != "*" && t != st[i]) {
			return false
		}
	}
	return len(pt) == len(st)
}

// deniedError is the Fatal error for a refused subject.
func (p permScope) deniedError(v violation) error { return permissionError(v, p.needed(v)) }

// permissionError is the Fatal error for a refused subject; grant is the
// subject pattern to allow.
func permissionError(v violation, grant string) error {
	verb, what := "publish to", "publish"
	if v.subscribe {
		verb, what = "subscribe to", "subscribe"
	}
	return fmt.Errorf("permission denied: the NATS user may not %s %q: grant it %s permission on %q (the stores/nats package documentation lists every permission the driver needs): %w: %w",
		verb, v.subject, what, grant, v.err, spate.ErrFatal)
}

// errPermDenied marks a context cancelled by a permission violation.
type errPermDenied struct{ v violation }

func (e *errPermDenied) Error() string { return e.v.err.Error() }

// guard returns ctx, cancelled as soon as the server refuses one of the
// store's subjects, and a func to call with the call's error when the call
// returns: it replaces *errp by a Fatal error that names the permission
// when that is why the call failed, prefixed with what ("nats: open") when
// what is not empty (the portable layer prefixes the primitives' errors).
func (s *store) guard(ctx context.Context, what string, errp *error) (context.Context, func()) {
	if s.perms == nil {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	remove := s.perms.add(func(v violation) {
		if s.scope.owns(v) {
			cancel(&errPermDenied{v})
		}
	})
	return ctx, func() {
		remove()
		var pd *errPermDenied
		if *errp != nil && errors.As(context.Cause(ctx), &pd) {
			*errp = s.scope.deniedError(pd.v)
			if what != "" {
				*errp = fmt.Errorf("%s: %w", what, *errp)
			}
		}
		cancel(nil)
	}
}
