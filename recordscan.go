package spate

import (
	"encoding/base64"
	"slices"
	"strconv"
	"unicode/utf8"
)

// The progress and spec records are read far more often than any other:
// at every watch event, and 2 × N of them when a view of a job of N splits
// opens. encoding/json's strict decoder spends most of that time on
// reflection and buffering. recordScanner reads the one form this package
// writes (json.Marshal of the record's struct) without either, and gives up
// on anything else: a key it does not know exactly or sees twice, a string
// with an escape or a control byte, a number with a fraction or an
// exponent, anything after the object. A record it gives up on is decoded
// by decodeStrict, which decides, so the scanner never accepts what
// decodeStrict refuses, and never reads a value decodeStrict would read
// differently (TestRecordScannerAgreesWithTheStrictDecoder checks both on
// mutated records).
type recordScanner struct {
	b []byte
	i int
}

func (s *recordScanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *recordScanner) byte(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

func (s *recordScanner) word(w string) bool {
	if len(s.b)-s.i >= len(w) && string(s.b[s.i:s.i+len(w)]) == w {
		s.i += len(w)
		return true
	}
	return false
}

// raw is a string's bytes, in place: only a string that needs no
// unquoting (no escape, no control byte, valid UTF-8) is taken.
func (s *recordScanner) raw() ([]byte, bool) {
	if !s.byte('"') {
		return nil, false
	}
	start, ascii := s.i, true
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			v := s.b[start:s.i]
			s.i++
			return v, ascii || utf8.Valid(v)
		case c == '\\' || c < ' ':
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
		s.i++
	}
	return nil, false
}

func (s *recordScanner) str() (string, bool) {
	v, ok := s.raw()
	return string(v), ok
}

// digits is an integer in JSON's grammar: an optional sign, then 0 or
// digits with no leading zero. A fraction or an exponent is left unread,
// so the object gives up at it (it is neither "," nor "}").
func (s *recordScanner) digits() ([]byte, bool) {
	start := s.i
	s.byte('-')
	first := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	n := s.i - first
	if n == 0 || (n > 1 && s.b[first] == '0') {
		return nil, false
	}
	return s.b[start:s.i], true
}

func (s *recordScanner) uint(bits int) (uint64, bool) {
	d, ok := s.digits()
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseUint(string(d), 10, bits) // refuses a sign
	return v, err == nil
}

func (s *recordScanner) int(bits int) (int64, bool) {
	d, ok := s.digits()
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(string(d), 10, bits)
	return v, err == nil
}

func (s *recordScanner) bool() (bool, bool) {
	switch {
	case s.word("true"):
		return true, true
	case s.word("false"):
		return false, true
	}
	return false, false
}

// bytes is a []byte field as encoding/json reads one: a base64 string
// ("" is an empty, non-nil slice).
func (s *recordScanner) bytes() ([]byte, bool) {
	v, ok := s.raw()
	if !ok {
		return nil, false
	}
	out := make([]byte, base64.StdEncoding.DecodedLen(len(v)))
	n, err := base64.StdEncoding.Decode(out, v)
	return out[:n], err == nil
}

// object reads one object and nothing after it. keys are the names of
// the fields, each read by read(its index); a key not among them gives
// up, as does a key seen twice. A null value is not read: it leaves the
// field as it is, which for a new record is what encoding/json leaves (the
// zero value, or nil).
func (s *recordScanner) object(keys []string, read func(i int) bool) bool {
	var seen uint64
	s.space()
	if !s.byte('{') {
		return false
	}
	s.space()
	if !s.byte('}') {
		for {
			key, ok := s.raw()
			if !ok {
				return false
			}
			i := slices.Index(keys, string(key))
			if i < 0 || seen&(1<<i) != 0 {
				return false
			}
			seen |= 1 << i
			s.space()
			if !s.byte(':') {
				return false
			}
			s.space()
			if !s.word("null") && !read(i) {
				return false
			}
			s.space()
			if s.byte(',') {
				s.space()
				continue
			}
			if s.byte('}') {
				break
			}
			return false
		}
	}
	s.space()
	return s.i == len(s.b)
}

// record is object for a record whose first three keys are "schema",
// "id" and "fp", read into schema, id and fp; read reads the others.
func (s *recordScanner) record(keys []string, schema *int, id *string, fp *uint64, read func(i int) bool) bool {
	return s.object(keys, func(i int) (ok bool) {
		switch i {
		case 0:
			var v int64
			v, ok = s.int(strconv.IntSize)
			*schema = int(v)
		case 1:
			*id, ok = s.str()
		case 2:
			*fp, ok = s.uint(64)
		default:
			ok = read(i)
		}
		return ok
	})
}

var progressKeys = []string{"schema", "id", "fp", "epoch", "status", "owner", "attempts", "advanced_epoch",
	"watermark", "state", "completed", "output", "written_at_ms", "last_failure", "parked", "remaining"}

// scan reads data into r, a new record, if data is in the scanner's form.
func (r *progressRecord) scan(data []byte) bool {
	s := recordScanner{b: data}
	return s.record(progressKeys, &r.Schema, &r.ID, &r.FP, func(i int) (ok bool) {
		switch i {
		case 3:
			r.Epoch, ok = s.uint(64)
		case 4:
			r.Status, ok = s.str()
		case 5:
			var v string
			v, ok = s.str()
			r.Owner = &v
		case 6:
			var v uint64
			v, ok = s.uint(32)
			r.Attempts = uint32(v)
		case 7:
			r.AdvancedEpoch, ok = s.uint(64)
		case 8:
			var v int64
			v, ok = s.int(64)
			r.Watermark = &v
		case 9:
			r.State, ok = s.bytes()
		case 10:
			r.Completed, ok = s.bool()
		case 11:
			r.Output, ok = s.bytes()
		case 12:
			r.WrittenAtMs, ok = s.int(64)
		case 13:
			r.LastFailure, ok = s.str()
		case 14:
			r.Parked, ok = s.bool()
		case 15:
			r.Remaining, ok = s.uint(64)
		}
		return ok
	})
}

var specKeys = []string{"schema", "id", "fp", "generation", "weight", "descriptor"}

// scan reads data into r, a new record, if data is in the scanner's form.
func (r *specRecord) scan(data []byte) bool {
	s := recordScanner{b: data}
	return s.record(specKeys, &r.Schema, &r.ID, &r.FP, func(i int) (ok bool) {
		switch i {
		case 3:
			r.Generation, ok = s.uint(64)
		case 4:
			r.Weight, ok = s.uint(64)
		case 5:
			r.Descriptor, ok = s.bytes()
		}
		return ok
	})
}
