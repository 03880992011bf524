package conformance

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/spate-go/spate"
)

// History records store operations as clients saw them, for a
// linearizability check with porcupine (the way etcd's robustness suite
// checks etcd). Call and return times come from one logical counter, so the
// real-time order of non-overlapping operations is exact whatever the clock
// (including a testing/synctest bubble, where wall time stands still).
//
// An operation that returned an error is recorded as unknown: it may or may
// not have taken effect, at any point after its call. Operations are
// recorded through a [Recorder] per client.
type History struct {
	clock atomic.Int64
	mu    sync.Mutex
	ops   []porcupine.Operation
}

// opKind is a recorded operation's primitive.
type opKind uint8

// Recorded primitives.
const (
	opGet opKind = iota + 1
	opCreate
	opUpdate
	opDelete
)

// opInput is a recorded operation's input.
type opInput struct {
	Kind     opKind
	Keyspace spate.Keyspace
	Key      string
	Value    string
	Expected uint64
}

// opOutput is a recorded operation's output.
type opOutput struct {
	Unknown  bool // the call failed: it may or may not have applied
	Won      bool // writes
	Present  bool // reads
	Value    string
	Revision uint64
}

// begin starts recording an operation and returns its call time.
func (h *History) begin() int64 { return h.clock.Add(1) }

// end records an operation that began at call.
func (h *History) end(client int, call int64, in opInput, out opOutput) {
	ret := h.clock.Add(1)
	if out.Unknown {
		ret = 1 << 62 // an unknown outcome may take effect at any later time
	}
	h.mu.Lock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
	h.mu.Unlock()
}

// Len is the number of recorded operations.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ops)
}

// Check reports whether the history is linearizable against the
// compare-and-swap register model, per key. On failure info describes the
// operations involved.
func (h *History) Check(timeout time.Duration) (ok bool, info string) {
	h.mu.Lock()
	ops := append([]porcupine.Operation(nil), h.ops...)
	h.mu.Unlock()
	res := porcupine.CheckOperationsTimeout(registerModel, ops, timeout)
	switch res {
	case porcupine.Ok:
		return true, ""
	case porcupine.Unknown:
		return true, "check timed out (inconclusive)"
	}
	return false, fmt.Sprintf("%d operations over %d keys are not linearizable", len(ops), countKeys(ops))
}

func countKeys(ops []porcupine.Operation) int {
	keys := map[string]bool{}
	for _, op := range ops {
		in := op.Input.(opInput)
		keys[in.Keyspace.String()+"/"+in.Key] = true
	}
	return len(keys)
}

// Recorder performs one client's calls on a store and records each, with
// its outcome, in a History: a call that failed is recorded with an
// unknown outcome (it may have landed).
type Recorder struct {
	H      *History
	Client int // the client's number in the history
	Store  spate.Store
}

// Get performs and records a Get.
func (r Recorder) Get(ctx context.Context, ks spate.Keyspace, key string) (spate.Entry, bool, error) {
	call := r.H.begin()
	en, ok, err := r.Store.Get(ctx, ks, key)
	out := opOutput{Present: ok, Value: string(en.Value), Revision: en.Revision}
	if err != nil {
		out = opOutput{Unknown: true}
	}
	r.H.end(r.Client, call, opInput{Kind: opGet, Keyspace: ks, Key: key}, out)
	return en, ok, err
}

// Create performs and records a Create.
func (r Recorder) Create(ctx context.Context, ks spate.Keyspace, key string, value []byte) (spate.Outcome, error) {
	call := r.H.begin()
	o, err := r.Store.Create(ctx, ks, key, value)
	r.H.end(r.Client, call, opInput{Kind: opCreate, Keyspace: ks, Key: key, Value: string(value)}, writeOut(o, err))
	return o, err
}

// Update performs and records an Update.
func (r Recorder) Update(ctx context.Context, ks spate.Keyspace, key string, value []byte, expected uint64) (spate.Outcome, error) {
	call := r.H.begin()
	o, err := r.Store.Update(ctx, ks, key, value, expected)
	r.H.end(r.Client, call, opInput{Kind: opUpdate, Keyspace: ks, Key: key, Value: string(value), Expected: expected}, writeOut(o, err))
	return o, err
}

// Delete performs and records a Delete.
func (r Recorder) Delete(ctx context.Context, ks spate.Keyspace, key string, expected uint64) (spate.Outcome, error) {
	call := r.H.begin()
	o, err := r.Store.Delete(ctx, ks, key, expected)
	r.H.end(r.Client, call, opInput{Kind: opDelete, Keyspace: ks, Key: key, Expected: expected}, writeOut(o, err))
	return o, err
}

func writeOut(o spate.Outcome, err error) opOutput {
	if err != nil {
		return opOutput{Unknown: true}
	}
	return opOutput{Won: o.Won, Revision: o.Revision}
}

// registerState is one key's state in the model. rev 0 with present means
// "revision unknown" (after a write whose outcome was unknown).
type registerState struct {
	present bool
	value   string
	rev     uint64
	floor   uint64 // every future revision of the key exceeds this
}

// registerModel is the sequential specification of one key of the store
// contract: create-if-absent, compare-and-swap update at the exact revision
// minting a strictly larger revision, guarded and unguarded delete, and
// reads of the latest value and revision. Expiry is not modelled; record
// durable keys, or ephemeral keys kept alive.
var registerModel = (&porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var order []string
		for _, op := range history {
			in := op.Input.(opInput)
			k := in.Keyspace.String() + "/" + in.Key
			if _, ok := by[k]; !ok {
				order = append(order, k)
			}
			by[k] = append(by[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(order))
		for _, k := range order {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() []any { return []any{registerState{}} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(registerState), input.(opInput), output.(opOutput)
		if out.Unknown {
			next := []any{s}
			if applied, ok := applyUnknown(s, in); ok {
				next = append(next, applied)
			}
			return next
		}
		if n, ok := step(s, in, out); ok {
			return []any{n}
		}
		return nil
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(opInput), output.(opOutput)
		return fmt.Sprintf("%v %s(%q, %q, %d) -> %+v", in.Keyspace, opName(in.Kind), in.Key, in.Value, in.Expected, out)
	},
}).ToModel()

func opName(k opKind) string {
	return [...]string{"?", "get", "create", "update", "delete"}[k]
}

// step applies one known-outcome operation; ok is false if the outcome is
// impossible in state s.
func step(s registerState, in opInput, out opOutput) (registerState, bool) {
	unknownRev := s.present && s.rev == 0
	switch in.Kind {
	case opGet:
		if out.Present != s.present {
			return s, false
		}
		if !s.present {
			return s, true
		}
		if out.Value != s.value || out.Revision <= s.floor && unknownRev || !unknownRev && out.Revision != s.rev {
			return s, false
		}
		s.rev = out.Revision // learn an unknown revision
		return s, true
	case opCreate:
		if s.present {
			return s, !out.Won
		}
		if !out.Won || out.Revision <= s.floor {
			return s, false
		}
		return registerState{present: true, value: in.Value, rev: out.Revision, floor: out.Revision}, true
	case opUpdate:
		match := s.present && (unknownRev || s.rev == in.Expected)
		if !out.Won {
			// A lost update is impossible when the revision surely matched.
			return s, !(s.present && !unknownRev && s.rev == in.Expected)
		}
		if !match || out.Revision <= s.floor {
			return s, false
		}
		return registerState{present: true, value: in.Value, rev: out.Revision, floor: out.Revision}, true
	case opDelete:
		if in.Expected == spate.AnyRevision {
			if !out.Won {
				return s, false
			}
			return registerState{floor: max(s.floor, out.Revision)}, true
		}
		match := s.present && (unknownRev || s.rev == in.Expected)
		if !out.Won {
			return s, !(s.present && !unknownRev && s.rev == in.Expected)
		}
		if !match {
			return s, false
		}
		return registerState{floor: max(s.floor, out.Revision)}, true
	}
	return s, false
}

// applyUnknown is the state after an operation whose outcome is unknown, had
// it applied.
func applyUnknown(s registerState, in opInput) (registerState, bool) {
	switch in.Kind {
	case opCreate:
		if s.present {
			return s, false
		}
		return registerState{present: true, value: in.Value, floor: s.floor}, true
	case opUpdate:
		if !s.present || s.rev != 0 && s.rev != in.Expected {
			return s, false
		}
		return registerState{present: true, value: in.Value, floor: max(s.floor, s.rev)}, true
	case opDelete:
		if !s.present || in.Expected != spate.AnyRevision && s.rev != 0 && s.rev != in.Expected {
			return s, false
		}
		return registerState{floor: max(s.floor, s.rev)}, true
	}
	return s, false
}
