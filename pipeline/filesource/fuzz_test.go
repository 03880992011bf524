package filesource_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline/filesource"
)

// A split descriptor comes from the store: any bytes decode to a descriptor
// or a Fatal error, never a panic, and a decoded descriptor re-encodes to one
// that decodes the same.
func FuzzDecodeDescriptor(f *testing.F) {
	good, _ := json.Marshal(filesource.Descriptor{Version: filesource.PackingVersion,
		Files: []filesource.Member{{Name: "a/b.log", Size: 10, MTime: 1}}})
	f.Add(good)
	f.Add([]byte(`{"v":1,"files":null}`))
	f.Add([]byte(`{"v":2,"files":[{"name":"big","size":100,"mtime":7}],"range":{"start":33,"end":66}}`))
	f.Add([]byte(`{"v":2,"files":[]}`))
	f.Add([]byte(`{"v":1,"files":[{"name":"x","size":-1,"mtime":0}]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := filesource.DecodeDescriptor(data)
		if err != nil {
			require.True(t, spate.IsFatal(err), "unclassified error: %v", err)
			return
		}
		again, err := json.Marshal(d)
		require.NoError(t, err)
		d2, err := filesource.DecodeDescriptor(again)
		require.NoError(t, err, "a decoded descriptor does not decode again")
		a, _ := json.Marshal(d2)
		require.Equal(t, string(again), string(a), "re-encoding does not round-trip: %s vs %s", a, again)
		_ = d.Total() // never panics, whatever the sizes
	})
}
