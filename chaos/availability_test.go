package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/history"
)

func sec(s float64) int64 { return int64(s * 1e9) }

func TestFaultCosts(t *testing.T) {
	ok := func(client int, kind history.Kind, key string, call, ret float64) history.Op {
		return history.Op{Client: client, In: history.Input{Kind: kind, Key: key}, Call: sec(call), Return: sec(ret)}
	}
	failed := func(client int, kind history.Kind, key string, call, at float64) history.Op {
		return history.Op{Client: client, In: history.Input{Kind: kind, Key: key}, Call: sec(call), Return: 1 << 62,
			Out: history.Output{Unknown: true, FailedAt: sec(at)}}
	}
	spans := []Span{{Fault: "kill", Node: "n1", Start: sec(10), End: sec(12)}, {Fault: "pause", Node: "n2", Start: sec(20), End: sec(22)}}
	ops := []history.Op{
		ok(1, history.Put, "/a", 9, 9.1),
		failed(1, history.Put, "/a", 10.1, 12.1),           // timed out: down from 10.1
		ok(1, history.Put, "/a", 12.1, 12.2),               // back: down 2.1 s
		ok(2, history.Put, "/registry/pods/x", 10.0, 11.0), // the partition's first success after the kill
		ok(2, history.Get, "/registry/pods/x", 11.0, 11.01),
		failed(3, history.Put, "/a", 19.9, 20.05), // under way when the pause struck: the pause's
		ok(3, history.Put, "/a", 20.5, 20.6),
	}
	costs := faultCosts(ops, spans, sec(30))
	if len(costs) != 2 {
		t.Fatalf("%d costs, want 2", len(costs))
	}
	kill, pause := costs[0], costs[1]
	if kill.WritesDown != 2100*time.Millisecond || kill.WritesFailed != 1 || kill.Writes != 3 {
		t.Errorf("kill: writes down %v, failed %d of %d; want 2.1s, 1 of 3", kill.WritesDown, kill.WritesFailed, kill.Writes)
	}
	// Partition 0 ("/a"): first success called after 10 s returned at
	// 12.2; the pods partition's at 11.0.
	if kill.WritesBack != 2200*time.Millisecond {
		t.Errorf("kill: writes back after %v, want 2.2s", kill.WritesBack)
	}
	if kill.ReadsBack != 1010*time.Millisecond || kill.ReadsDown != 0 {
		t.Errorf("kill: reads back after %v, down %v; want 1.01s, 0", kill.ReadsBack, kill.ReadsDown)
	}
	if pause.WritesFailed != 1 || pause.WritesDown != 700*time.Millisecond {
		t.Errorf("pause: %d writes failed, down %v; want 1 (the one under way when it struck), 700ms", pause.WritesFailed, pause.WritesDown)
	}
	if r := availabilityReport("brain", costs); !strings.Contains(r, "kill") || !strings.Contains(r, "2.1s") {
		t.Errorf("report lacks the kill's numbers:\n%s", r)
	}
	// A client that never succeeds again is reported as such.
	never := faultCosts([]history.Op{failed(1, history.Put, "/a", 10.5, 12.5)}, spans[:1], sec(15))
	if never[0].WritesDown != -1 || never[0].WritesBack != -1 {
		t.Errorf("a client that never recovered: down %v back %v, want -1", never[0].WritesDown, never[0].WritesBack)
	}
}

func TestNoLeaderAllowed(t *testing.T) {
	spans := []Span{
		{Fault: "kill", Node: "n1", Start: sec(1), End: sec(9)},
		{Fault: "isolate", Node: "n2", Start: sec(10), End: sec(15)},
		{Fault: "restart-all", Start: sec(30), End: sec(30.5)},
	}
	for _, c := range []struct {
		node string
		at   float64
		want bool
	}{
		{"n1", 6, false},   // another node's kill never excuses it
		{"n2", 11, false},  // cut off for less than the grace
		{"n2", 13.5, true}, // cut off for 3.5 s
		{"n2", 19, true},   // within the slack after the heal
		{"n2", 21, false},  // long after
		{"n3", 13.5, false},
		{"", 13.5, true},   // a watch of unknown node: any node was cut off
		{"n1", 33.5, true}, // the cluster lost its quorum
	} {
		if got := noLeaderAllowed(spans, c.node, sec(c.at), sec(40)); got != c.want {
			t.Errorf("noLeaderAllowed(%q, %vs) = %v, want %v", c.node, c.at, got, c.want)
		}
	}
}

func TestCheckSerialReads(t *testing.T) {
	put := func(client int, key, value string, call, ret float64, rev int64) history.Op {
		return history.Op{Client: client, In: history.Input{Kind: history.Put, Key: key, Value: value}, Call: sec(call), Return: sec(ret),
			Out: history.Output{Rev: rev, OK: true, Member: 2}} // through another node
	}
	ref := &history.Watch{Complete: 10, Resps: []history.Response{{Events: []history.Event{
		{Key: "k", Value: "a", Rev: 2}, {Key: "k", Value: "b", Rev: 5}, {Key: "j", Value: "x", Rev: 7},
	}}}}
	ops := []history.Op{put(1, "k", "a", 1, 1.01, 2), put(1, "k", "b", 2, 2.01, 5), put(1, "j", "x", 3, 3.01, 7)}
	read := func(node string, key string, call float64, rev int64, exists bool, value string, mod int64) SerialRead {
		return SerialRead{Node: node, Key: key, Call: sec(call), Return: sec(call + 0.001), Rev: rev, Exists: exists, Value: value, Mod: mod, Member: 1}
	}
	good := []SerialRead{
		read("n1", "k", 2.05, 5, true, "b", 5), // write at 5 acknowledged 40 ms before: may be missed, is not
		read("n1", "k", 2.5, 5, true, "b", 5),
		read("n1", "j", 3.05, 5, false, "", 0), // the write at 7 was acknowledged 40 ms before: within the bound
	}
	if errs := checkSerialReads(good, ops, ref, nil, []string{"n1"}); len(errs) > 0 {
		t.Fatalf("good reads: %v", errs)
	}
	for name, bad := range map[string][]SerialRead{
		"wrong state":   {read("n1", "k", 2.5, 5, true, "a", 2)},
		"too stale":     {read("n1", "k", 2.5, 2, true, "a", 2)},                                        // the write at 5 was acknowledged 490 ms before
		"went backward": {read("n1", "k", 2.5, 6, true, "b", 5), read("n1", "k", 2.6, 5, true, "b", 5)}, // below what n1 answered
	} {
		if errs := checkSerialReads(bad, ops, ref, nil, []string{"n1"}); len(errs) == 0 {
			t.Errorf("%s: no violation", name)
		}
	}
	// Under a fault a stale read is allowed; after a restart of its node
	// the node's header may start lower.
	spans := []Span{{Fault: "kill", Node: "n1", Start: sec(2.55), End: sec(2.56)}}
	if errs := checkSerialReads([]SerialRead{read("n1", "k", 2.5, 5, true, "b", 5), read("n1", "k", 2.6, 2, true, "a", 2)}, ops, ref, spans, []string{"n1"}); len(errs) > 0 {
		t.Fatalf("a stale read right after its node restarted: %v", errs)
	}
}
