package diskfault

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// Mode is the fault being injected.
type Mode int32

// The modes.
const (
	Off   Mode = iota // no fault
	Stall             // every write and sync waits Delay first
	Fail              // syncs fail with EIO
	Full              // writes and file creation fail with ENOSPC
)

var modeNames = map[string]Mode{"off": Off, "stall": Stall, "fail": Fail, "full": Full}

func (m Mode) String() string {
	for n, v := range modeNames {
		if v == m {
			return n
		}
	}
	return fmt.Sprintf("Mode(%d)", int32(m))
}

// ParseMode parses a mode name.
func ParseMode(s string) (Mode, error) {
	m, ok := modeNames[s]
	if !ok {
		return Off, fmt.Errorf("diskfault: unknown mode %q (want off, stall, fail or full)", s)
	}
	return m, nil
}

// Injector decides, per filesystem operation, whether it fails or waits.
// It implements errorfs.Injector.
type Injector struct {
	mode     atomic.Int32
	delay    atomic.Int64 // nanoseconds, for Stall
	injected atomic.Int64
}

// Set switches the mode; delay applies to Stall.
func (i *Injector) Set(m Mode, delay time.Duration) {
	i.delay.Store(int64(delay))
	i.mode.Store(int32(m))
}

// Mode returns the current mode.
func (i *Injector) Mode() Mode { return Mode(i.mode.Load()) }

// Injected returns how many operations were failed or stalled.
func (i *Injector) Injected() int64 { return i.injected.Load() }

// MaybeError implements errorfs.Injector.
func (i *Injector) MaybeError(op errorfs.Op) error {
	switch Mode(i.mode.Load()) {
	case Stall:
		if op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			i.injected.Add(1)
			time.Sleep(time.Duration(i.delay.Load()))
		}
	case Fail:
		switch op.Kind {
		case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
			i.injected.Add(1)
			return fmt.Errorf("diskfault: injected sync failure on %s: %w", op.Path, syscall.EIO)
		}
	case Full:
		switch op.Kind {
		case errorfs.OpFileWrite, errorfs.OpFileWriteAt, errorfs.OpCreate, errorfs.OpFilePreallocate:
			i.injected.Add(1)
			return fmt.Errorf("diskfault: injected full disk on %s: %w", op.Path, syscall.ENOSPC)
		}
	}
	return nil
}

// String implements errorfs.Injector.
func (i *Injector) String() string { return "diskfault(" + i.Mode().String() + ")" }

// Wrap returns fs with the injector's faults.
func Wrap(fs vfs.FS, i *Injector) vfs.FS { return errorfs.Wrap(fs, i) }

// Handler serves POST ?mode=off|stall|fail|full[&delay=DURATION] and GET
// (the current mode).
func (i *Injector) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			m, err := ParseMode(r.URL.Query().Get("mode"))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			delay := time.Second
			if d := r.URL.Query().Get("delay"); d != "" {
				if delay, err = time.ParseDuration(d); err != nil || delay < 0 {
					http.Error(w, fmt.Sprintf("diskfault: bad delay %q", d), http.StatusBadRequest)
					return
				}
			}
			i.Set(m, delay)
		}
		fmt.Fprintf(w, "mode=%s injected=%d\n", i.Mode(), i.Injected())
	})
}
