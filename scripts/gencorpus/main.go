// Command gencorpus writes the deterministic corpus of
// scripts/backfill-bench.sh: access-log-like lines in files spread over a
// few directories. The defaults give 300 files, 273,864 lines and about
// 47 MiB, the corpus of issue 17.
//
//	go run ./scripts/gencorpus -dir /tmp/corpus [-files 300] [-lines 273864] [-seed 17]
package main

import (
	"bufio"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

func main() {
	dir := flag.String("dir", "", "directory to write the corpus into (created; must not exist or be empty)")
	files := flag.Int("files", 300, "files")
	lines := flag.Int("lines", 273864, "lines in all")
	seed := flag.Uint64("seed", 17, "random seed (same seed, same corpus)")
	flag.Parse()
	if *dir == "" || *files < 1 || *lines < *files {
		fmt.Fprintln(os.Stderr, "usage: gencorpus -dir DIR [-files N] [-lines N] [-seed N]")
		os.Exit(2)
	}
	n, size, err := generate(*dir, *files, *lines, *seed)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gencorpus:", err)
		os.Exit(1)
	}
	fmt.Printf("%d files, %d lines, %d bytes (%.1f MiB)\n", *files, n, size, float64(size)/(1<<20))
}

var (
	methods = []string{"GET", "GET", "GET", "POST", "PUT", "DELETE"}
	paths   = []string{"/api/items", "/api/users", "/api/orders", "/static/app.js", "/healthz", "/api/search"}
	codes   = []int{200, 200, 200, 200, 201, 204, 304, 404, 500}
	agents  = []string{
		"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0 Safari/537.36",
		"Mozilla/5.0 (Macintosh; Intel Mac OS X 14_4) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Safari/605.1.15",
		"curl/8.5.0",
		"Go-http-client/1.1",
		"Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:125.0) Gecko/20100101 Firefox/125.0",
	}
)

const hexDigits = "0123456789abcdef"

// generate writes files files holding lines lines in all (each file's
// count varies around the mean; the last takes the remainder).
func generate(dir string, files, lines int, seed uint64) (int64, int64, error) {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	base := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	mean := lines / files
	left := lines
	var total, size int64
	var buf []byte
	for i := range files {
		n := mean - mean/4 + r.IntN(mean/2+1)
		if i == files-1 || n > left-(files-1-i) {
			n = left - (files - 1 - i)
		}
		left -= n
		p := filepath.Join(dir, fmt.Sprintf("host-%02d", i%6), fmt.Sprintf("access-%03d.log", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return 0, 0, err
		}
		t := base.Add(time.Duration(i) * time.Hour)
		buf = buf[:0]
		for j := range n {
			t = t.Add(time.Duration(r.IntN(3000)) * time.Millisecond)
			buf = t.AppendFormat(buf, time.RFC3339Nano)
			buf = fmt.Appendf(buf, " host-%02d %s %s/%d %d %dms req=%d-%d trace=", i%6,
				methods[r.IntN(len(methods))], paths[r.IntN(len(paths))], r.IntN(100000),
				codes[r.IntN(len(codes))], 1+r.IntN(900), i, j)
			for range 14 {
				buf = append(buf, hexDigits[r.IntN(16)])
			}
			buf = append(buf, ` ua="`...)
			buf = append(buf, agents[r.IntN(len(agents))]...)
			buf = append(buf, `" bytes=`...)
			buf = strconv.AppendInt(buf, int64(r.IntN(1<<20)), 10)
			buf = append(buf, '\n')
		}
		f, err := os.Create(p)
		if err != nil {
			return 0, 0, err
		}
		w := bufio.NewWriter(f)
		_, err = w.Write(buf)
		if err == nil {
			err = w.Flush()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return 0, 0, err
		}
		total += int64(n)
		size += int64(len(buf))
	}
	return total, size, nil
}
