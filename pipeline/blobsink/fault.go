package blobsink

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"gocloud.dev/gcerrors"

	"github.com/spate-go/spate"
)

// bucketFault is an error of the bucket marked with its kind: Retryable
// for a fault that passes, Fatal for one no retry can mend. Its text is
// the bucket's error and, for a fatal one, what to fix.
type bucketFault struct {
	err  error
	kind error // spate.ErrRetryable or spate.ErrFatal
	fix  string
}

func (f *bucketFault) Error() string {
	if f.fix == "" {
		return f.err.Error()
	}
	return f.err.Error() + " (" + f.fix + ")"
}

func (f *bucketFault) Unwrap() []error { return []error{f.err, f.kind} }

// fault marks err, an error of a bucket call, with its kind (see the
// package documentation): Retryable when it passes, Fatal with the fix
// when no retry mends it, unmarked when it is neither.
func fault(err error) error {
	if err == nil || errors.Is(err, spate.ErrRetryable) || errors.Is(err, spate.ErrFatal) {
		return err
	}
	if transient(err) {
		return &bucketFault{err: err, kind: spate.ErrRetryable}
	}
	switch gcerrors.Code(err) {
	case gcerrors.PermissionDenied:
		return &bucketFault{err: err, kind: spate.ErrFatal,
			fix: "access denied: give the credentials the job runs with permission to list, read, write and delete objects in the bucket; a retry cannot mend it"}
	case gcerrors.NotFound:
		return &bucketFault{err: err, kind: spate.ErrFatal,
			fix: "the bucket was not found: check the destination URL (bucket name, region, endpoint), or create the bucket; a retry cannot mend it"}
	case gcerrors.InvalidArgument, gcerrors.Unimplemented:
		return &bucketFault{err: err, kind: spate.ErrFatal,
			fix: "the bucket refused the request: check the destination URL and its options; a retry cannot mend it"}
	}
	return err
}

// transient reports whether err is a fault of the bucket that passes: the
// deadline of one call, a network error, a 5xx answer or throttling.
func transient(err error) bool {
	switch gcerrors.Code(err) {
	case gcerrors.Internal, gcerrors.ResourceExhausted, gcerrors.DeadlineExceeded, gcerrors.Canceled:
		return true
	case gcerrors.PermissionDenied, gcerrors.NotFound, gcerrors.InvalidArgument, gcerrors.Unimplemented,
		gcerrors.FailedPrecondition, gcerrors.AlreadyExists:
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	// An HTTP answer (the S3 SDK's errors carry their status code and
	// the service's error code; other drivers map theirs to the codes
	// above).
	var status interface{ HTTPStatusCode() int }
	if errors.As(err, &status) {
		if c := status.HTTPStatusCode(); c >= 500 || c == 429 || c == 408 {
			return true
		}
	}
	var api interface{ ErrorCode() string }
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout", "Throttling",
			"ThrottlingException", "RequestLimitExceeded", "TooManyRequests", "RequestThrottled":
			return true
		}
	}
	return false
}
