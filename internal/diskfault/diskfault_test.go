package diskfault

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

func TestModes(t *testing.T) {
	inj := new(Injector)
	fs := Wrap(vfs.NewMem(), inj)
	f, err := fs.Create("wal", vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("a")); err != nil {
		t.Fatalf("off: write: %v", err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("off: sync: %v", err)
	}

	inj.Set(Fail, 0)
	if _, err := f.Write([]byte("b")); err != nil {
		t.Fatalf("fail: a write must still succeed: %v", err)
	}
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("fail: sync returned %v, want EIO", err)
	}

	inj.Set(Full, 0)
	if _, err := f.Write([]byte("c")); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("full: write returned %v, want ENOSPC", err)
	}
	if _, err := fs.Create("sst", vfs.WriteCategoryUnspecified); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("full: create returned %v, want ENOSPC", err)
	}

	inj.Set(Stall, 0)
	before := inj.Injected()
	if err := f.Sync(); err != nil {
		t.Fatalf("stall: sync: %v", err)
	}
	if inj.Injected() != before+1 {
		t.Fatalf("stall: the sync was not stalled (injected %d, was %d)", inj.Injected(), before)
	}

	inj.Set(Off, 0)
	if _, err := f.Write([]byte("d")); err != nil {
		t.Fatalf("off again: write: %v", err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("off again: sync: %v", err)
	}
}

func TestHandler(t *testing.T) {
	inj := new(Injector)
	srv := httptest.NewServer(inj.Handler())
	defer srv.Close()
	resp, err := http.Post(srv.URL+"?mode=full", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || inj.Mode() != Full {
		t.Fatalf("POST mode=full: status %d, mode %s", resp.StatusCode, inj.Mode())
	}
	for _, q := range []string{"?mode=melt", "?mode=stall&delay=soon", "?mode=stall&delay=-1s"} {
		resp, err := http.Post(srv.URL+q, "text/plain", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("POST %s: status %d, want 400", q, resp.StatusCode)
		}
	}
	if inj.Mode() != Full {
		t.Errorf("a bad request changed the mode to %s", inj.Mode())
	}
}
