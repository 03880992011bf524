package pipeline

import (
	"errors"
	"fmt"

	"github.com/spate-go/spate"
)

// ErrOutputDamaged marks a staging sink's Publish error that no retry can
// mend: what the split published before was deleted, replaced, truncated or
// written to under the job. The coordination driver then sets the split
// aside (it fails it through the coordinator with the error as the
// reason) instead of publishing again.
var ErrOutputDamaged = errors.New("the split's published output was damaged under the job")

// FatalError stops a pipeline: the component that failed and why.
type FatalError struct {
	Component string
	Reason    string
}

func (e *FatalError) Error() string { return e.Component + ": " + e.Reason }

// Is makes errors.Is(err, spate.ErrFatal) hold for a FatalError.
func (e *FatalError) Is(target error) bool { return target == spate.ErrFatal }

func fatalf(component, format string, args ...any) *FatalError {
	return &FatalError{Component: component, Reason: fmt.Sprintf(format, args...)}
}

// isFatal reports whether an error reaching the control loop stops the
// pipeline. The Fatal class does: Fatal errors, and Fenced ones as a
// backstop (a Fenced error is handled where it arises — the commit that
// lost its split — and one that reaches the control loop means a
// component lost track of what it owns); everything else is logged and
// tolerated. An error that nobody classified is fatal (spate.IsFatal).
func isFatal(err error) bool {
	if err == nil {
		return false
	}
	var fe *FatalError
	if errors.As(err, &fe) {
		return true
	}
	return spate.IsFatal(err) || spate.IsFenced(err)
}
