package server

import (
	"errors"
	"os"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// dataDirState tells whether dir exists and whether it holds anything:
// New cleans up after a failed start only for a data directory that was
// missing or empty before (a new store).
func dataDirState(fs vfs.FS, dir string) (exists, inUse bool) {
	names, err := fs.List(dir)
	if err != nil {
		return !errors.Is(err, os.ErrNotExist), !errors.Is(err, os.ErrNotExist)
	}
	return true, len(names) > 0
}

// removeNewStore removes what a failed start of a new store created in
// dir: the directory too if it did not exist before, else (a mount point,
// say) only its contents.
func removeNewStore(fs vfs.FS, dir string, existed bool) error {
	if !existed {
		return fs.RemoveAll(dir)
	}
	names, err := fs.List(dir)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := fs.RemoveAll(fs.PathJoin(dir, n)); err != nil {
			return err
		}
	}
	return nil
}
