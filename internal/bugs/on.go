//go:build chaosbugs

package bugs

import "os"

var chosen = os.Getenv("BRAIN_INJECT_BUG")

// On reports whether the named bug is injected.
func On(name string) bool { return chosen == name }
