package spate

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// strictly is what decodeStrict makes of data, the scanner aside.
func strictly[R any](data []byte) (*R, error) {
	var r R
	var schema *int
	switch v := any(&r).(type) {
	case *progressRecord:
		schema = &v.Schema
	case *specRecord:
		schema = &v.Schema
	}
	return &r, decodeStrict(data, &r, schema)
}

// drawText is a string of the kinds records hold: plain ids, and now and
// then one with bytes json.Marshal escapes or a multi-byte rune.
func drawText(t *rapid.T, label string) string {
	if rapid.IntRange(0, 4).Draw(t, label+"-odd") > 0 {
		return rapid.StringMatching(`[a-z0-9._-]{0,12}`).Draw(t, label)
	}
	return rapid.StringOf(rapid.SampledFrom([]rune{'a', 'é', '…', '"', '\\', '<', '&', '\n', 0x7f, 0x2028, '\u00ff'})).Draw(t, label)
}

func drawBytes(t *rapid.T, label string) []byte {
	if rapid.IntRange(0, 4).Draw(t, label+"-nil") == 0 {
		return nil
	}
	return rapid.SliceOfN(rapid.Byte(), 0, 40).Draw(t, label)
}

func drawProgress(t *rapid.T) *progressRecord {
	r := &progressRecord{
		Schema:        rapid.SampledFrom([]int{SchemaVersion, SchemaVersion, 0, 2, -1}).Draw(t, "schema"),
		ID:            drawText(t, "id"),
		FP:            rapid.Uint64().Draw(t, "fp"),
		Epoch:         rapid.Uint64().Draw(t, "epoch"),
		Status:        rapid.SampledFrom([]string{statusRunnable, statusCompleted, statusQuarant}).Draw(t, "status"),
		Attempts:      rapid.Uint32().Draw(t, "attempts"),
		AdvancedEpoch: rapid.Uint64().Draw(t, "advanced"),
		State:         drawBytes(t, "state"),
		Completed:     rapid.Bool().Draw(t, "completed"),
		Output:        drawBytes(t, "output"),
		WrittenAtMs:   rapid.Int64().Draw(t, "written"),
		LastFailure:   drawText(t, "failure"),
		Parked:        rapid.Bool().Draw(t, "parked"),
	}
	if rapid.Bool().Draw(t, "owned") {
		o := drawText(t, "owner")
		r.Owner = &o
	}
	if rapid.Bool().Draw(t, "committed") {
		w := rapid.Int64().Draw(t, "watermark")
		r.Watermark = &w
	}
	return r
}

func drawSpec(t *rapid.T) *specRecord {
	return &specRecord{
		Schema:     rapid.SampledFrom([]int{SchemaVersion, 3}).Draw(t, "schema"),
		ID:         drawText(t, "id"),
		FP:         rapid.Uint64().Draw(t, "fp"),
		Generation: rapid.Uint64().Draw(t, "generation"),
		Weight:     rapid.Uint64().Draw(t, "weight"),
		Descriptor: drawBytes(t, "descriptor"),
	}
}

// plain says whether json.Marshal writes s as it is, with no escape: the
// scanner must then read it.
func plain(s string) bool {
	b, _ := json.Marshal(s)
	return string(b) == `"`+s+`"`
}

// Every record this package writes with plain strings is scanned, and reads
// as the strict decoder reads it. A scanner that always gave up (or read a
// field wrong) fails here.
func TestRecordScannerReadsWhatThePackageWrites(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := drawProgress(t)
		data := encode(r)
		var got progressRecord
		ok := got.scan(data)
		owner := ""
		if r.Owner != nil {
			owner = *r.Owner
		}
		if plain(r.ID) && plain(owner) && plain(r.LastFailure) {
			require.True(t, ok, "a record as the package writes it is not scanned: %s", data)
		}
		if ok {
			want, err := strictly[progressRecord](data)
			requireReadAlike(t, err, r.Schema)
			require.Equal(t, want, &got, "%s", data)
		}

		sp := drawSpec(t)
		data = encode(sp)
		var gotSpec specRecord
		ok = gotSpec.scan(data)
		if plain(sp.ID) {
			require.True(t, ok, "a spec as the package writes it is not scanned: %s", data)
		}
		if ok {
			want, err := strictly[specRecord](data)
			requireReadAlike(t, err, sp.Schema)
			require.Equal(t, want, &gotSpec, "%s", data)
		}
	})
}

// requireReadAlike holds the strict decoder's verdict on a record the
// scanner read: no error, or only the schema's (which both paths check
// after reading, and whose value must then match too).
func requireReadAlike(t require.TestingT, err error, schema int) {
	if schema == SchemaVersion {
		require.NoError(t, err)
		return
	}
	require.ErrorContains(t, err, "schema")
}

// mutate changes data the ways a damaged or alien record differs: bytes
// dropped, replaced or inserted from JSON's own alphabet, or a field
// appended, repeated or renamed.
func mutate(t *rapid.T, data []byte) []byte {
	out := append([]byte(nil), data...)
	alphabet := []byte(`{}[]:,"\ 0123456789-+.eEtruefalsn` + "\t\n\v\f\x00\xff")
	for range rapid.IntRange(1, 2).Draw(t, "mutations") {
		i := rapid.IntRange(0, len(out)).Draw(t, "at")
		switch rapid.IntRange(0, 7).Draw(t, "how") {
		case 0: // drop a run
			j := min(len(out), i+rapid.IntRange(1, 6).Draw(t, "len"))
			out = append(out[:i:i], out[j:]...)
		case 1: // replace a byte
			if i < len(out) {
				out[i] = rapid.SampledFrom(alphabet).Draw(t, "byte")
			}
		case 2: // insert a byte
			c := rapid.SampledFrom(alphabet).Draw(t, "byte")
			out = append(out[:i:i], append([]byte{c}, out[i:]...)...)
		case 3: // a field again, or one the record does not have
			key := rapid.SampledFrom([]string{"schema", "id", "fp", "epoch", "owner", "state", "watermark", "descriptor", "ID", "Owner", "extra"}).Draw(t, "key")
			val := rapid.SampledFrom([]string{"1", "null", `"x"`, `"AA=="`, "true", "-0", "1e3", "18446744073709551616", `{}`}).Draw(t, "value")
			if k := strings.LastIndexByte(string(out), '}'); k >= 0 {
				out = append(out[:k:k], []byte(`,"`+key+`":`+val+`}`)...)
			}
		case 4: // trailing data
			out = append(out, rapid.SampledFrom([]string{" ", "}", "{}", " x", "\n"}).Draw(t, "trailer")...)
		case 5: // a number's form: a sign, a leading zero, a fraction
			field := rapid.SampledFrom([]string{`"schema":`, `"epoch":`, `"fp":`, `"attempts":`, `"watermark":`, `"weight":`, `"written_at_ms":`}).Draw(t, "field")
			if k := strings.Index(string(out), field); k >= 0 {
				k += len(field)
				if rapid.Bool().Draw(t, "before") {
					pre := rapid.SampledFrom([]string{"0", "-", "+", "00", "-0"}).Draw(t, "prefix")
					out = append(out[:k:k], append([]byte(pre), out[k:]...)...)
				} else if e := strings.IndexAny(string(out[k:]), ",}"); e >= 0 {
					suf := rapid.SampledFrom([]string{".0", "e1", "0", ".", "E-1"}).Draw(t, "suffix")
					out = append(out[:k+e:k+e], append([]byte(suf), out[k+e:]...)...)
				}
			}
		case 7: // a string's bytes: not UTF-8, an escape, a control byte
			field := rapid.SampledFrom([]string{`"id":"`, `"status":"`, `"owner":"`, `"state":"`, `"descriptor":"`, `"last_failure":"`}).Draw(t, "field")
			if k := strings.Index(string(out), field); k >= 0 {
				k += len(field)
				ins := rapid.SampledFrom([]string{"\xff", "\xc3", "\\u0041", "\\n", "\t", "\x7f", "\u00e9", "\\\"", "=", "A", "*"}).Draw(t, "insert")
				out = append(out[:k:k], append([]byte(ins), out[k:]...)...)
			}
		case 6: // leading space
			out = append([]byte(" \t\r\n"), out...)
		}
	}
	return out
}

// The scanner never accepts what the strict decoder refuses and never reads
// a value differently: on every mutated record, a scan that succeeds
// matches the strict decode exactly. Both outcomes must occur, or the check
// proved nothing.
func TestRecordScannerAgreesWithTheStrictDecoder(t *testing.T) {
	var scanned, gaveUp int
	rapid.Check(t, func(t *rapid.T) {
		var data []byte
		spec := rapid.Bool().Draw(t, "spec")
		if spec {
			data = mutate(t, encode(drawSpec(t)))
		} else {
			data = mutate(t, encode(drawProgress(t)))
		}
		var ok bool
		var got, want any
		var err error
		if spec {
			var r specRecord
			ok, got = r.scan(data), &r
			want, err = strictly[specRecord](data)
		} else {
			var r progressRecord
			ok, got = r.scan(data), &r
			want, err = strictly[progressRecord](data)
		}
		if !ok {
			gaveUp++
			return
		}
		scanned++
		if err != nil && !strings.Contains(err.Error(), "schema ") {
			t.Fatalf("the scanner accepted %q, which the strict decoder refuses: %v", data, err)
		}
		// A schema refusal comes after the whole record was read: the
		// values must match then too.
		require.Equal(t, want, got, "%q", data)
	})
	t.Logf("mutated records: %d scanned, %d left to the strict decoder", scanned, gaveUp)
	assert.Positive(t, scanned, "no mutated record was scanned: the check proved nothing")
	assert.Positive(t, gaveUp, "no mutated record was refused by the scanner")
}

// A record the scanner gives up on is still read, by the strict decoder:
// decodeProgress and decodeSpec give the same result on the same bytes
// whichever path reads them.
func TestARecordTheScannerGivesUpOnIsReadStrictly(t *testing.T) {
	fp := fingerprintHash("job")
	owner := "w1"
	w := int64(7)
	r := &progressRecord{Schema: SchemaVersion, ID: "s1", FP: fp, Status: statusRunnable, Owner: &owner, Watermark: &w, LastFailure: "lost <lease> & ran \"out\""}
	data := encode(r)
	var probe progressRecord
	require.False(t, probe.scan(data), "escaped strings are the strict decoder's to read")
	got, err := decodeProgress("split.s1", "s1", data, fp)
	require.NoError(t, err)
	assert.Equal(t, r, got)

	// Whitespace and field order do not matter to either path.
	spaced := []byte(" {\n \"id\" : \"s1\", \"fp\": " + jsonNum(fp) + ", \"status\":\"runnable\", \"schema\":1 } \n")
	var sc progressRecord
	require.True(t, sc.scan(spaced))
	got, err = decodeProgress("split.s1", "s1", spaced, fp)
	require.NoError(t, err)
	assert.Equal(t, "s1", got.ID)

	// Alien and damaged records are refused by both, with the key named.
	for _, bad := range []string{
		`{"schema":1,"id":"s1","fp":` + jsonNum(fp) + `,"status":"runnable","extra":1}`,
		`{"schema":1,"id":"s1","fp":` + jsonNum(fp) + `,"status":"runnable"}{}`,
		`{"schema":2,"id":"s1","fp":` + jsonNum(fp) + `,"status":"runnable"}`,
		`{"schema":1,"id":"s1","fp":` + jsonNum(fp) + `,"status":"runnable","epoch":1.5}`,
	} {
		_, err := decodeProgress("split.s1", "s1", []byte(bad), fp)
		require.Error(t, err, bad)
		assert.ErrorIs(t, err, ErrFatal)
		assert.Contains(t, err.Error(), `"split.s1"`)
	}
}

func jsonNum(v uint64) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func BenchmarkDecodeProgress(b *testing.B) {
	fp := fingerprintHash("bench")
	owner := "spate-0123456789abcdef0123456789abcdef"
	w := int64(123456789)
	data := encode(&progressRecord{Schema: SchemaVersion, ID: "split-000123", FP: fp, Epoch: 4, Status: statusRunnable, Owner: &owner,
		Attempts: 1, AdvancedEpoch: 4, Watermark: &w, State: []byte(`{"base":0,"size":1048576}`), Output: []byte(`{"file":"part-0001","len":4096}`), WrittenAtMs: 1764800000000})
	b.Run("scanned", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, err := decodeProgress("split.split-000123", "split-000123", data, fp); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("strict", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, err := strictly[progressRecord](data); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// Each form the scanner must leave to the strict decoder, one edit of a
// canonical record each: the scanner gives up, and decodeProgress still
// reads (or refuses) the record as the strict decoder does.
func TestRecordScannerGivesUpOnEachFormItDoesNotRead(t *testing.T) {
	fp := fingerprintHash("job")
	owner := "w1"
	w := int64(7)
	canonical := string(encode(&progressRecord{Schema: SchemaVersion, ID: "s1", FP: fp, Epoch: 3, Status: statusRunnable,
		Owner: &owner, Watermark: &w, State: []byte("st"), WrittenAtMs: 5, LastFailure: "f1"}))
	var probe progressRecord
	require.True(t, probe.scan([]byte(canonical)), canonical)
	edits := map[string][2]string{
		"an escape in a string":      {`"owner":"w1"`, `"owner":"w\u0031"`},
		"a string not UTF-8":         {`"last_failure":"f1"`, "\"last_failure\":\"f\xff1\""},
		"a cut rune":                 {`"last_failure":"f1"`, "\"last_failure\":\"f\xc31\""},
		"a control byte":             {`"owner":"w1"`, "\"owner\":\"w\t1\""},
		"bad base64":                 {`"state":"c3Q="`, `"state":"c3Q*"`},
		"base64 without its padding": {`"state":"c3Q="`, `"state":"c3Q"`},
		"a leading zero":             {`"epoch":3`, `"epoch":03`},
		"a fraction":                 {`"epoch":3`, `"epoch":3.0`},
		"an exponent":                {`"epoch":3`, `"epoch":3e0`},
		"a plus sign":                {`"epoch":3`, `"epoch":+3`},
		"a negative unsigned":        {`"epoch":3`, `"epoch":-3`},
		"an unsigned past 32 bits":   {`"attempts":0`, `"attempts":4294967296`},
		"a key seen twice":           {`"epoch":3`, `"epoch":3,"epoch":4`},
		"a key in another case":      {`"epoch":3`, `"Epoch":3`},
		"an unknown key":             {`"epoch":3`, `"epoch":3,"era":1`},
		"a vertical tab":             {`"epoch":3`, "\"epoch\":\v3"},
		"a string for a number":      {`"epoch":3`, `"epoch":"3"`},
		"a number for a string":      {`"owner":"w1"`, `"owner":1`},
		"an object for a string":     {`"owner":"w1"`, `"owner":{}`},
		"trailing data":              {`"f1"}`, `"f1"}x`},
		"a second object":            {`"f1"}`, `"f1"}{}`},
		"a missing comma":            {`,"epoch":3`, ` "epoch":3`},
	}
	for name, e := range edits {
		t.Run(name, func(t *testing.T) {
			require.Contains(t, canonical, e[0])
			data := []byte(strings.Replace(canonical, e[0], e[1], 1))
			var r progressRecord
			assert.False(t, r.scan(data), "%q", data)
			want, wantErr := strictly[progressRecord](data)
			got, err := decodeProgress("split.s1", "s1", data, fp)
			if wantErr != nil {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, want, got)
		})
	}
}
