//go:build !chaosbugs

package bugs

// On reports whether the named bug is injected (never, without the
// chaosbugs build tag).
func On(string) bool { return false }
