package server

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// diskFS is an in-memory file system reporting a disk of a given size and
// free space.
type diskFS struct {
	vfs.FS
	total, avail uint64
}

func (d *diskFS) GetDiskUsage(string) (vfs.DiskUsage, error) {
	return vfs.DiskUsage{TotalBytes: d.total, AvailBytes: d.avail, UsedBytes: d.total - d.avail}, nil
}

func TestBallastSize(t *testing.T) {
	const mib, gib = 1 << 20, 1 << 30
	for _, c := range []struct {
		total, memtable uint64
		want            int64
	}{
		{100 * gib, 64 * mib, 256 * mib}, // 1% is 1 GiB: capped
		{10 * gib, 64 * mib, 102 * mib},  // 1% (102.4 MiB)
		{2 * gib, 64 * mib, 64 * mib},    // 1% is 20 MiB: a memtable
		{300 * mib, 64 * mib, 15 * mib},  // a memtable is 21%: 5% of the disk
	} {
		if got := ballastSize(c.total, c.memtable); got/mib != c.want/mib {
			t.Errorf("ballastSize(%d MiB, %d MiB) = %d MiB, want %d MiB", c.total/mib, c.memtable/mib, got/mib, c.want/mib)
		}
	}
}

// TestBallast follows the ballast through a node's starts: set up when the
// disk has room, kept, removed when the node starts on a full disk (its
// space is what the replay of the write-ahead log needs), not set up again
// while the disk stays short, and removed when turned off.
func TestBallast(t *testing.T) {
	const mib = 1 << 20
	fs := &diskFS{FS: vfs.NewMem(), total: 100 * mib, avail: 90 * mib}
	if err := fs.MkdirAll("data", 0o755); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	size := func() int64 {
		st, err := fs.Stat("data/" + ballastName)
		if err != nil {
			return -1
		}
		return st.Size()
	}
	step := func(cfg int64, wantSize int64, wantSaid string) {
		t.Helper()
		said := manageBallast(fs, "data", cfg, 8*mib, log)
		if !strings.HasPrefix(said, wantSaid) {
			t.Errorf("manageBallast said %q, want %q...", said, wantSaid)
		}
		if got := size(); got != wantSize {
			t.Errorf("ballast size %d, want %d", got, wantSize)
		}
	}
	step(0, -1, "none")                // off: nothing
	step(BallastAuto, 5*mib, "set up") // 1% is 1 MiB, a memtable 8, 5% of the disk 5
	step(BallastAuto, 5*mib, "kept")
	fs.avail = 1 * mib // the disk filled: the node stopped, and starts again
	step(BallastAuto, -1, "removed")
	fs.avail = 6 * mib // some space freed, but not twice the ballast
	step(BallastAuto, -1, "none (too little")
	fs.avail = 50 * mib
	step(2*mib, 2*mib, "set up")
	step(0, -1, "removed (disabled)")
}
