//go:build race

package main

// raceEnabled builds the binary under test with -race when the tests run
// with it.
const raceEnabled = true
