package etcdcompat

import (
	"testing"
	"time"
)

// TestFeedDemand: feeds are wanted at start, stop being wanted after the
// idle time without watchers (not before), are wanted again at once when
// a watch opens, and stay wanted while one is open.
func TestFeedDemand(t *testing.T) {
	d := newFeedDemand(100 * time.Millisecond)
	wanted, changed := d.get()
	if !wanted {
		t.Fatal("feeds not wanted at start")
	}
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("feeds still wanted after the idle time without watchers")
	}
	if wanted, _ := d.get(); wanted {
		t.Fatal("changed, but still wanted")
	}
	_, changed = d.get()
	d.add(1)
	select {
	case <-changed:
	default:
		t.Fatal("a watch did not make the feeds wanted")
	}
	time.Sleep(300 * time.Millisecond)
	if wanted, _ := d.get(); !wanted {
		t.Fatal("feeds idled with a watch open")
	}
	d.add(-1)
	if wanted, _ := d.get(); !wanted {
		t.Fatal("feeds idled at once when the last watch closed")
	}
	d.add(1) // a watch within the idle time cancels the idling
	time.Sleep(300 * time.Millisecond)
	if wanted, _ := d.get(); !wanted {
		t.Fatal("feeds idled although a watch reopened within the idle time")
	}

	never := newFeedDemand(-1)
	never.add(1)
	never.add(-1)
	time.Sleep(50 * time.Millisecond)
	if wanted, _ := never.get(); !wanted {
		t.Fatal("negative idle time: feeds idled")
	}
}
