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
// Never match error strings; use errors.Is or [KindOf].
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

// ErrorKind says how a caller must react to an error.
type ErrorKind uint8

const (
	// KindNone is the kind of a nil error.
	KindNone ErrorKind = iota
	// KindFenced: the split is no longer owned; nothing was written.
	KindFenced
	// KindRetryable: transient; the operation may succeed if retried.
	KindRetryable
	// KindFatal: unrecoverable; stop.
	KindFatal
)

func (k ErrorKind) String() string {
	switch k {
	case KindNone:
		return "none"
	case KindFenced:
		return "fenced"
	case KindRetryable:
		return "retryable"
	case KindFatal:
		return "fatal"
	}
	return fmt.Sprintf("ErrorKind(%d)", uint8(k))
}

func (k ErrorKind) sentinel() error {
	switch k {
	case KindFenced:
		return ErrFenced
	case KindRetryable:
		return ErrRetryable
	case KindNone:
		return nil
	}
	return ErrFatal
}

// Error is a coordination error with a kind and a human-readable reason.
// It wraps its cause, if any.
type Error struct {
	Kind   ErrorKind
	Reason string
	Err    error
}

func (e *Error) Error() string {
	s := "spate: " + e.Kind.String()
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	return s
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is matches the sentinel of e's kind, so errors.Is(err, ErrFenced) holds
// for a fenced *Error.
func (e *Error) Is(target error) bool { return target != nil && target == e.Kind.sentinel() }

func newError(kind ErrorKind, format string, args []any) error {
	cause := fmt.Errorf(format, args...)
	return &Error{Kind: kind, Reason: cause.Error(), Err: errors.Unwrap(cause)}
}

// Fatalf returns a Fatal *Error. %w verbs wrap their operands.
func Fatalf(format string, args ...any) error { return newError(KindFatal, format, args) }

// Retryablef returns a Retryable *Error. %w verbs wrap their operands.
func Retryablef(format string, args ...any) error { return newError(KindRetryable, format, args) }

// Fencedf returns a Fenced *Error. %w verbs wrap their operands.
func Fencedf(format string, args ...any) error { return newError(KindFenced, format, args) }

// KindOf classifies any error. A *Error reports its own kind; otherwise the
// sentinels decide (ErrFenced, then ErrRetryable, then ErrFatal); a
// cancelled or expired context is Retryable; anything else unclassified is
// Fatal, because an error nobody classified cannot be assumed transient.
func KindOf(err error) ErrorKind {
	if err == nil {
		return KindNone
	}
	if e, ok := errors.AsType[*Error](err); ok {
		if e.Kind == KindNone {
			return KindFatal
		}
		return e.Kind
	}
	switch {
	case errors.Is(err, ErrFenced):
		return KindFenced
	case errors.Is(err, ErrFatal):
		return KindFatal
	case errors.Is(err, ErrRetryable),
		errors.Is(err, context.Canceled),
		errors.Is(err, context.DeadlineExceeded):
		return KindRetryable
	}
	return KindFatal
}

// IsRetryable reports whether err is transient.
func IsRetryable(err error) bool { return KindOf(err) == KindRetryable }

// IsFenced reports whether err means "no longer owned; nothing written".
func IsFenced(err error) bool { return KindOf(err) == KindFenced }

// IsFatal reports whether err is unrecoverable.
func IsFatal(err error) bool { return KindOf(err) == KindFatal }
