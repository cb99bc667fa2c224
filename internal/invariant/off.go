//go:build !invariants

package invariant

// Enabled is true when built with the invariants tag.
const Enabled = false
