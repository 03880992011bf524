//go:build !linux

package main

import "os/exec"

// setDeathSignal is Linux-only; elsewhere the demo kills its workers on
// every way out it controls.
func setDeathSignal(*exec.Cmd) {}
