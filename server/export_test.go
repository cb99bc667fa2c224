package server

// SetLocalSplitKeys sets localSplitKeys, the most keys a partition that
// splits by load or size may hold for its new half to be placed anywhere,
// to n, and returns the function that restores it. Set it before starting
// servers and restore it after they stopped (t.Cleanup before
// testutil.StartCluster): their split drivers read it unsynchronised.
func SetLocalSplitKeys(n int) (restore func()) {
	old := localSplitKeys
	localSplitKeys = n
	return func() { localSplitKeys = old }
}
