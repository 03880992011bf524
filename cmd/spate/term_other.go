//go:build !unix

package main

import "os"

// terminalWidth is $COLUMNS where the window size cannot be asked for, else
// 0 (unknown).
func terminalWidth(*os.File) int { return columnsEnv() }
