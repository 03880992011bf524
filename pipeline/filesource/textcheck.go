package filesource

import (
	"bytes"
	"io"
	"os"
)

// sniffLen is how many of a file's first bytes tell text from not.
const sniffLen = 512

// magics are the first bytes of compressed and archive formats: such a
// file holds no lines.
var magics = []struct {
	kind  string
	magic []byte
}{
	{"gzip", []byte{0x1f, 0x8b}},
	{"bzip2", []byte("BZh")},
	{"xz", []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}},
	{"zstd", []byte{0x28, 0xb5, 0x2f, 0xfd}},
	{"zip", []byte("PK\x03\x04")},
	{"lz4", []byte{0x04, 0x22, 0x4d, 0x18}},
	{"compress (.Z)", []byte{0x1f, 0x9d}},
}

// notText says why head, a file's first bytes, are not text: the magic
// number of a compressed format it starts with, or a NUL byte among them.
// "" when they look like text (an empty head too).
func notText(head []byte) string {
	head = head[:min(len(head), sniffLen)]
	for _, m := range magics {
		if bytes.HasPrefix(head, m.magic) {
			return m.kind + " data"
		}
	}
	if bytes.IndexByte(head, 0) >= 0 {
		return "NUL bytes"
	}
	return ""
}

// sniffFile reads the first bytes of the file at path and says why they
// are not text ("" for text, an empty file, or a file that cannot be
// read: the lane reports that).
func sniffFile(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var b [sniffLen]byte
	n, _ := io.ReadFull(f, b[:])
	return notText(b[:n])
}
