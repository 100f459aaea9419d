//go:build !linux

package objstoretest

import "os/exec"

// setProcAttr does nothing here: only Linux has a parent-death signal.
func setProcAttr(*exec.Cmd) {}
