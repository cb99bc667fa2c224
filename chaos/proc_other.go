//go:build !linux

package chaos

import "os/exec"

// dieWithParent does nothing where the kernel cannot tie a child's life to
// its parent's; the harness's nodes outlive a killed harness there.
func dieWithParent(*exec.Cmd) {}
