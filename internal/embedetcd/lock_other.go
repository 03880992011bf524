//go:build !unix

package embedetcd

import "os"

// tryLockFile is a no-op where flock is unavailable: two processes starting
// the default store at once on one data directory then race, and the loser
// fails to open the data directory.
func tryLockFile(*os.File) (bool, error) { return true, nil }

func unlockFile(*os.File) error { return nil }

// canTellRunning: processRuns cannot tell.
const canTellRunning = false

// processRuns cannot tell here: no attendee record counts.
func processRuns(int) bool { return false }
