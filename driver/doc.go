// Package driver is the package of those who write a store driver for
// spate (the users of a store import the driver's own package and the
// root's spate.Store contract; they need nothing here).
//
// A driver implements the small [Driver] interface, the backend's half of
// the six primitives, and hands it to [NewStore]. The [PortableStore] it
// returns is the spate.Store the coordinator uses: it holds, once for all
// drivers, the closed state, the tracking of calls in flight (Close
// cancels them and waits), the argument checks, the value cap, Update's
// revision-0 rule, the optional capabilities a Driver implements
// (spate.Releaser, spate.KeyWatcher, spate.Sessioner) and the error format
// ([OpError]). [ClosedError] and [ContextError] format the errors of a
// driver's own methods the same way. This is the shape of the Go CDK's
// blob.Bucket over driver.Bucket.
//
// The conformance package is the driver's test: every driver runs
// conformance.RunStore and conformance.RunCoordinator against a real
// server.
package driver
