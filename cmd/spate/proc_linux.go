package main

import (
	"os/exec"
	"syscall"
)

// setDeathSignal makes the child die with this process, so a demo killed
// mid-run leaves no worker behind.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
