package spate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"time"
)

// SchemaVersion is the schema number every record this version writes
// carries. Records of any other schema are rejected Fatal: versions do not
// interoperate, and the remedy is a new job name.
const SchemaVersion = 1

// Key layout. The durable and ephemeral keyspaces share the split key name
// (split.{id}): the progress record and the lease are two faces of one
// contended entity. No prefix shadows another.
const (
	keyPlan         = "plan"
	keyLeader       = "leader"
	prefixSpec      = "spec."
	prefixSplit     = "split."
	prefixAssign    = "assign."
	prefixWorker    = "worker."
	prefixProbe     = "_probe."
	statusRunnable  = "runnable"
	statusCompleted = "completed"
	statusQuarant   = "quarantined"
	finalityOpen    = "open"
	finalityFinal   = "final"
)

// fingerprintHash is the 64-bit FNV-1a hash of a job fingerprint, stored in
// every spec and progress record so that two jobs sharing a namespace cannot
// read each other's records as their own.
func fingerprintHash(fingerprint string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(fingerprint))
	return h.Sum64()
}

// planRecord is the durable "plan" key.
type planRecord struct {
	Schema       int     `json:"schema"`
	Fingerprint  string  `json:"fingerprint"`
	Generation   uint64  `json:"generation"`
	Finality     string  `json:"finality"`
	Planned      uint64  `json:"planned"`
	PlannerState *[]byte `json:"planner_state"`
	UpdatedAtMs  int64   `json:"updated_at_ms"`
}

// specRecord is the durable, immutable "spec.{id}" key.
type specRecord struct {
	Schema     int    `json:"schema"`
	ID         string `json:"id"`
	FP         uint64 `json:"fp"`
	Generation uint64 `json:"generation"`
	Weight     uint64 `json:"weight"`
	Descriptor []byte `json:"descriptor"`
}

// leaseVal is the ephemeral "split.{id}" key.
type leaseVal struct {
	Schema int    `json:"schema"`
	Owner  string `json:"owner"`
	Nonce  string `json:"nonce"`
	Epoch  uint64 `json:"epoch"`
}

// leaderVal is the ephemeral "leader" key.
type leaderVal struct {
	Schema     int    `json:"schema"`
	Owner      string `json:"owner"`
	Nonce      string `json:"nonce"`
	Generation uint64 `json:"generation"`
}

// workerVal is the ephemeral "worker.{instance}" presence key.
type workerVal struct {
	Schema      int    `json:"schema"`
	Nonce       string `json:"nonce"`
	MaxInFlight int    `json:"max_in_flight"`
}

// assignmentVal is the durable "assign.{instance}" key: an instruction, not
// a grant of ownership. Splits are sorted so that an unchanged assignment is
// byte-identical.
type assignmentVal struct {
	Schema     int      `json:"schema"`
	Generation uint64   `json:"generation"`
	Splits     []string `json:"splits"`
	// Divide asks the member to divide these splits it holds (the
	// division trigger, autodivide.go); absent: none.
	Divide []divideAsk `json:"divide,omitempty"`
}

func nowMs() int64 { return time.Now().UnixMilli() }

// encode writes a record as compact JSON.
func encode(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("spate: encoding %T: %v", v, err)) // our own types always encode
	}
	return b
}

// decodeStrict parses one JSON object into v: unknown fields, trailing data
// and a wrong schema number are errors.
func decodeStrict(data []byte, v any, schema *int) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("trailing data after the record")
	}
	return checkSchema(*schema)
}

// decodeRecord is decodeStrict for a record the scanner reads: scanned
// when it is in the form this package writes, decoded strictly otherwise.
func decodeRecord[R any, P interface {
	*R
	scan([]byte) bool
}](data []byte, r P, schema *int) error {
	if r.scan(data) {
		return checkSchema(*schema)
	}
	*r = *new(R)
	return decodeStrict(data, r, schema)
}

func checkSchema(schema int) error {
	if schema != SchemaVersion {
		return fmt.Errorf("schema %d, this version reads schema %d (versions do not interoperate: use a new job name)", schema, SchemaVersion)
	}
	return nil
}

// recordError is the Fatal error for an unreadable or alien record. It names
// the key so an operator can find it.
func recordError(ks Keyspace, key string, err error) error {
	return Fatalf("%s record %q is unreadable or belongs to another job (two incompatible jobs may share a namespace): %v: %w", ks, key, err, ErrUnreadableRecord)
}

func decodePlan(key string, data []byte, fingerprint string) (*planRecord, error) {
	var r planRecord
	if err := decodeStrict(data, &r, &r.Schema); err != nil {
		return nil, recordError(Durable, key, err)
	}
	if r.Finality != finalityOpen && r.Finality != finalityFinal {
		return nil, recordError(Durable, key, fmt.Errorf("finality %q", r.Finality))
	}
	if r.Fingerprint != fingerprint {
		return nil, Fatalf("job fingerprint mismatch: the store's plan record has %q, this worker has %q; every worker of a job must be configured identically (or use a new job name)",
			r.Fingerprint, fingerprint)
	}
	return &r, nil
}

func decodeSpec(key, id string, data []byte, fp uint64) (*specRecord, error) {
	var r specRecord
	if err := decodeRecord(data, &r, &r.Schema); err != nil {
		return nil, recordError(Durable, key, err)
	}
	if err := checkIdentity(key, id, r.ID, fp, r.FP); err != nil {
		return nil, err
	}
	if r.Descriptor == nil {
		return nil, recordError(Durable, key, fmt.Errorf("descriptor is missing"))
	}
	return &r, nil
}

func checkIdentity(key, keyID, recID string, fp, recFP uint64) error {
	if recID != keyID {
		return recordError(Durable, key, fmt.Errorf("id %q does not match the key (the namespace is corrupt)", recID))
	}
	if recFP != fp {
		return Fatalf("record %q has fingerprint hash %d, this job's is %d: two jobs share a namespace: %w", key, recFP, fp, ErrUnreadableRecord)
	}
	return nil
}

func decodeLease(key string, data []byte) (*leaseVal, error) {
	var r leaseVal
	if err := decodeStrict(data, &r, &r.Schema); err != nil {
		return nil, recordError(Ephemeral, key, err)
	}
	if ValidateInstanceID(r.Owner) != nil || r.Nonce == "" {
		return nil, recordError(Ephemeral, key, fmt.Errorf("owner %q / nonce %q", r.Owner, r.Nonce))
	}
	return &r, nil
}

func decodeLeader(data []byte) (*leaderVal, error) {
	var r leaderVal
	if err := decodeStrict(data, &r, &r.Schema); err != nil {
		return nil, recordError(Ephemeral, keyLeader, err)
	}
	if ValidateInstanceID(r.Owner) != nil || r.Nonce == "" {
		return nil, recordError(Ephemeral, keyLeader, fmt.Errorf("owner %q / nonce %q", r.Owner, r.Nonce))
	}
	return &r, nil
}

func decodeWorker(key string, data []byte) (*workerVal, error) {
	var r workerVal
	if err := decodeStrict(data, &r, &r.Schema); err != nil {
		return nil, fmt.Errorf("presence record %q: %w", key, err)
	}
	return &r, nil
}

// decodeAssignment parses an assignment record. Its errors are not Fatal:
// an unreadable assignment costs balance, not safety, and must never be read
// as an empty one (which would release everything).
func decodeAssignment(key string, data []byte) (*assignmentVal, error) {
	var r assignmentVal
	if err := decodeStrict(data, &r, &r.Schema); err != nil {
		return nil, fmt.Errorf("assignment record %q: %w", key, err)
	}
	if r.Splits == nil {
		return nil, fmt.Errorf("assignment record %q: splits is missing", key)
	}
	for _, s := range r.Splits {
		if _, err := NewSplitID(s); err != nil {
			return nil, fmt.Errorf("assignment record %q: %w", key, err)
		}
	}
	return &r, nil
}
