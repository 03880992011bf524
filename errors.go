package spate

import (
	"context"
	"errors"
	"fmt"
)

// The error classes. Every error spate returns satisfies errors.Is with
// exactly one of ErrFenced, ErrRetryable or ErrFatal. Store drivers keep the
// backend's error and add the class:
//
//	fmt.Errorf("etcd: update %q: %w: %w", key, err, spate.ErrRetryable)
//
// Never match error strings; use errors.Is, or [IsRetryable], [IsFenced] and [IsFatal].
var (
	// ErrFenced: a fenced write lost, so this instance no longer owns the
	// split and nothing was written. Callers intercept it and treat the split
	// as lost; it is never produced by a store.
	ErrFenced = errors.New("spate: fenced")
	// ErrRetryable: a transient failure (timeout, transport error, broken or
	// lagged watch, cancelled context). A write that fails Retryable MAY
	// HAVE LANDED: the reply, not necessarily the write, was lost. Re-read
	// before assuming either way.
	ErrRetryable = errors.New("spate: retryable")
	// ErrFatal: unrecoverable (misconfiguration, a store without the
	// required atomic primitives, a corrupt or alien record, a diverging
	// job fingerprint, an unsupported server version). The pipeline must
	// stop.
	ErrFatal = errors.New("spate: fatal")
)

// Refinements of the classes above. Each is returned wrapped together with
// its class, so errors.Is matches both.
var (
	// ErrClosed is returned (with ErrFatal) by every call after Close but
	// Close itself, which is idempotent.
	ErrClosed = errors.New("spate: closed")
	// ErrValueTooLarge is returned (with ErrFatal) by a store write whose
	// value exceeds the store's reported cap; nothing was written.
	ErrValueTooLarge = errors.New("spate: value too large")
	// ErrInvalidKey is returned (with ErrFatal) for a key or prefix outside
	// the store key syntax; nothing was written.
	ErrInvalidKey = errors.New("spate: invalid key")
	// ErrUnreadableRecord is returned (with ErrFatal) for a record of the
	// job that cannot be read: corrupt bytes, an unknown schema, an id
	// that does not match its key, or another job's fingerprint. A
	// coordinator takes only the split it belongs to out of play.
	ErrUnreadableRecord = errors.New("spate: unreadable record")
	// ErrSessionExpired is returned (with ErrFatal) by every call on a
	// [Session] that expired: no KeepAlive reached the store for a TTL,
	// and the keys bound to it are gone. Start a new session.
	ErrSessionExpired = errors.New("spate: session expired")
)

// errorKind says how a caller must react to an error.
type errorKind uint8

const (
	// kindNone is the kind of a nil error.
	kindNone errorKind = iota
	// kindFenced: the split is no longer owned; nothing was written.
	kindFenced
	// kindRetryable: transient; the operation may succeed if retried.
	kindRetryable
	// kindFatal: unrecoverable; stop.
	kindFatal
)

func (k errorKind) String() string {
	switch k {
	case kindNone:
		return "none"
	case kindFenced:
		return "fenced"
	case kindRetryable:
		return "retryable"
	case kindFatal:
		return "fatal"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

func (k errorKind) sentinel() error {
	switch k {
	case kindFenced:
		return ErrFenced
	case kindRetryable:
		return ErrRetryable
	case kindNone:
		return nil
	}
	return ErrFatal
}

// classError is an error made by Fatalf, Retryablef or Fencedf: a class
// and a reason, wrapping its cause if any.
type classError struct {
	kind   errorKind
	reason string
	err    error
}

func (e *classError) Error() string {
	s := "spate: " + e.kind.String()
	if e.reason != "" {
		s += ": " + e.reason
	}
	return s
}

// Unwrap returns the cause.
func (e *classError) Unwrap() error { return e.err }

// Is matches the sentinel of e's class, so errors.Is(err, ErrFenced) holds
// for an error made by Fencedf.
func (e *classError) Is(target error) bool { return target != nil && target == e.kind.sentinel() }

func newError(kind errorKind, format string, args []any) error {
	cause := fmt.Errorf(format, args...)
	return &classError{kind: kind, reason: cause.Error(), err: errors.Unwrap(cause)}
}

// Fatalf returns a Fatal error: errors.Is(err, ErrFatal) holds. %w verbs
// wrap their operands.
func Fatalf(format string, args ...any) error { return newError(kindFatal, format, args) }

// Retryablef returns a Retryable error: errors.Is(err, ErrRetryable)
// holds. %w verbs wrap their operands.
func Retryablef(format string, args ...any) error { return newError(kindRetryable, format, args) }

// Fencedf returns a Fenced error: errors.Is(err, ErrFenced) holds. %w
// verbs wrap their operands.
func Fencedf(format string, args ...any) error { return newError(kindFenced, format, args) }

// kindOf classifies any error. An error of Fatalf, Retryablef or Fencedf
// reports its own class; otherwise the
// sentinels decide (ErrFenced, then ErrRetryable, then ErrFatal); a
// cancelled or expired context is Retryable; anything else unclassified is
// Fatal, because an error nobody classified cannot be assumed transient.
func kindOf(err error) errorKind {
	if err == nil {
		return kindNone
	}
	if e, ok := errors.AsType[*classError](err); ok {
		if e.kind == kindNone {
			return kindFatal
		}
		return e.kind
	}
	switch {
	case errors.Is(err, ErrFenced):
		return kindFenced
	case errors.Is(err, ErrFatal):
		return kindFatal
	case errors.Is(err, ErrRetryable),
		errors.Is(err, context.Canceled),
		errors.Is(err, context.DeadlineExceeded):
		return kindRetryable
	}
	return kindFatal
}

// IsRetryable reports whether err is transient: it matches ErrRetryable
// (and neither ErrFenced nor ErrFatal), or it is a bare cancelled or
// expired context.
func IsRetryable(err error) bool { return kindOf(err) == kindRetryable }

// IsFenced reports whether err means "no longer owned; nothing written":
// it matches ErrFenced.
func IsFenced(err error) bool { return kindOf(err) == kindFenced }

// IsFatal reports whether err is unrecoverable: it matches ErrFatal, or
// nobody classified it (an error nobody classified cannot be assumed
// transient). A nil error is none of the three.
func IsFatal(err error) bool { return kindOf(err) == kindFatal }
