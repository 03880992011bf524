// Package conformance proves that a [spate.Store] driver keeps the store
// contract, and that the coordinator keeps fencing and monotone watermarks
// on top of it. It is the same suite for every driver, ours or a user's.
//
// A driver opts in with a few lines of test:
//
//	func TestConformance(t *testing.T) {
//		conformance.RunStore(t, func(t testing.TB) conformance.Harness {
//			return newHarness(t) // a fresh namespace on a real server
//		})
//	}
//
// Every rule is one named subtest whose failure message states the rule it
// saw broken, so a failing run reads like a list of broken promises. The
// same rules run without a testing.T through [CheckStore] and
// [CheckCoordinator], which return an error as testing/fstest.TestFS does;
// spate conformance runs them that way against a live deployment.
//
// The suite is itself tested: this package's tests run it against
// deliberately broken drivers, at least one per rule, and require each to be
// caught.
//
// The rules of an optional capability ([spate.Releaser]: ReleaserIsReported
// and the Release* rules; [spate.KeyWatcher]: KeyWatcherIsReported and the
// WatchKeys* rules; [spate.Sessioner]: SessionerIsReported and the session
// rules) run on a store that has it and skip, with the reason, on one that
// does not: a SKIP under [RunStore], a Skipped [Result] under [CheckStore],
// never a silent pass.
//
// # Traceability
//
// Each store rule checks one sentence of the store contract (the
// documentation of [spate.Store], its methods and types, and of its error
// classes). docs/conformance-traceability.md in the module lists every
// sentence of the contract with the rules that check it, or why none can;
// a test keeps that list, the contract and the rules in step.
package conformance
