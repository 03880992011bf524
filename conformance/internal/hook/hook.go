// Package hook is where package conformance leaves the measurements that
// run on its own fleet for conformance/scale: conformance imports this
// package (which imports nothing of the project's) and sets [Lifecycle]
// in its init; conformance/scale, which imports conformance for its
// harness types, calls it. The measurement code stays unexported in
// conformance, beside the fleet it drives, and out of that package's
// documentation, whose readers want the contract's rules. Use
// conformance/scale, not this package.
package hook

import "testing"

// Lifecycle counts the store calls of one split's lifecycle, step by step,
// over a store of mk (a conformance.HarnessMaker), and fails t when a step
// costs more than goals allows (goals[mode][step]). Package conformance
// sets it; scale.MeasureLifecycle documents it.
var Lifecycle func(t *testing.T, mk any, goals map[string]map[string]int)
