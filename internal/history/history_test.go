package history

import (
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

func op(client int, call, ret int64, in Input, out Output) Op {
	return Op{Client: client, In: in, Out: out, Call: call, Return: ret}
}

func TestLinearizabilityChecker(t *testing.T) {
	ok := []Op{
		op(0, 0, 10, Input{Kind: Put, Key: "k", Value: "a"}, Output{Rev: 2, OK: true}),
		op(1, 20, 30, Input{Kind: Get, Key: "k"}, Output{Rev: 2, Exists: true, Value: "a", Mod: 2}),
		op(1, 40, 50, Input{Kind: CAS, Key: "k", Value: "b", ExpectMod: 2}, Output{Rev: 3, OK: true}),
		op(0, 60, 70, Input{Kind: CAS, Key: "k", Value: "c", ExpectMod: 2}, Output{Rev: 3}),
		// Unknown outcome: either way is fine.
		op(2, 80, 0, Input{Kind: Put, Key: "k", Value: "d"}, Output{Unknown: true}),
		op(0, 90, 95, Input{Kind: Get, Key: "k"}, Output{Rev: 4, Exists: true, Value: "d", Mod: 4}),
	}
	for i := range ok {
		if ok[i].Out.Unknown {
			ok[i].Return = 1 << 62
		}
	}
	if res, _ := CheckLinearizable(ok, time.Minute, ""); res != porcupine.Ok {
		t.Fatalf("linearizable history judged %v", res)
	}
	stale := append(append([]Op(nil), ok[:3]...),
		// Reads the value the CAS replaced after the CAS returned.
		op(0, 60, 70, Input{Kind: Get, Key: "k"}, Output{Rev: 3, Exists: true, Value: "a", Mod: 2}))
	if res, _ := CheckLinearizable(stale, time.Minute, ""); res != porcupine.Illegal {
		t.Fatalf("stale read judged %v", res)
	}
	lostCAS := append(append([]Op(nil), ok[:2]...),
		// Two CAS on the same mod revision both succeed.
		op(1, 40, 50, Input{Kind: CAS, Key: "k", Value: "b", ExpectMod: 2}, Output{Rev: 3, OK: true}),
		op(0, 60, 70, Input{Kind: CAS, Key: "k", Value: "c", ExpectMod: 2}, Output{Rev: 4, OK: true}))
	if res, _ := CheckLinearizable(lostCAS, time.Minute, ""); res != porcupine.Illegal {
		t.Fatalf("double CAS judged %v", res)
	}
}

func TestRevisionChecker(t *testing.T) {
	good := []Op{
		op(0, 0, 10, Input{Kind: Put, Key: "a", Value: "1"}, Output{Rev: 2, OK: true}),
		op(1, 20, 30, Input{Kind: Put, Key: "b", Value: "2"}, Output{Rev: 3, OK: true}),
		op(2, 40, 50, Input{Kind: Get, Key: "c"}, Output{Rev: 3}),
	}
	if errs := CheckRevisions(good); len(errs) != 0 {
		t.Fatalf("good history: %v", errs)
	}
	cases := map[string][]Op{
		"reused revision": {good[0], op(1, 20, 30, Input{Kind: Put, Key: "b", Value: "2"}, Output{Rev: 2, OK: true})},
		"revision going back in real time": {good[0], good[1],
			op(3, 60, 70, Input{Kind: Put, Key: "d", Value: "3"}, Output{Rev: 2, OK: true})},
		"read below an acknowledged write": {good[0], good[1], op(2, 40, 50, Input{Kind: Get, Key: "c"}, Output{Rev: 2})},
	}
	for name, h := range cases {
		if errs := CheckRevisions(h); len(errs) == 0 {
			t.Errorf("%s: not detected", name)
		}
	}
	// A violation names the members that answered, when known.
	stale := op(2, 40, 50, Input{Kind: Get, Key: "c"}, Output{Rev: 2, Member: 0xbe0a})
	errs := CheckRevisions([]Op{good[0], good[1], stale})
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "answered by member be0a") {
		t.Errorf("violation %v does not name member be0a", errs)
	}
}

func ev(key, val string, rev int64, prev *PrevKV) Event {
	return Event{Key: key, Value: val, Rev: rev, Create: rev, Ver: 1, Prev: prev}
}

func TestWatchChecker(t *testing.T) {
	ref := &Watch{Name: "ref", Key: "\x00", End: "\x00", Start: 1, PrevKV: true, Complete: 5, Resps: []Response{
		{Events: []Event{ev("a", "1", 2, nil)}},
		{Events: []Event{ev("b", "2", 3, nil), ev("c", "3", 3, nil)}},
		{Events: []Event{{Key: "a", Rev: 4, Delete: true, Prev: &PrevKV{Value: "1", Mod: 2}}}},
		{Events: []Event{ev("a", "5", 5, nil)}},
	}}
	good := &Watch{Name: "w", Key: "a", End: "c", Start: 3, PrevKV: true, Complete: 5, Resps: []Response{
		{Events: []Event{ev("b", "2", 3, nil)}},
		{Progress: true, Header: 3},
		{Events: []Event{{Key: "a", Rev: 4, Delete: true, Prev: &PrevKV{Value: "1", Mod: 2}}, ev("a", "5", 5, nil)}},
	}}
	if errs := CheckWatch(good, ref); len(errs) != 0 {
		t.Fatalf("good watch: %v", errs)
	}
	mutate := map[string]func(w *Watch){
		"missing event":   func(w *Watch) { w.Resps[2].Events = w.Resps[2].Events[1:] },
		"duplicate event": func(w *Watch) { w.Resps[0].Events = append(w.Resps[0].Events, w.Resps[0].Events[0]) },
		"wrong prev_kv":   func(w *Watch) { w.Resps[2].Events[0].Prev = &PrevKV{Value: "x", Mod: 2} },
		"early progress":  func(w *Watch) { w.Resps[1].Header = 4 },
		"out of order": func(w *Watch) {
			e := w.Resps[2].Events
			e[0], e[1] = e[1], e[0]
		},
	}
	for name, f := range mutate {
		w := Watch{Name: good.Name, Key: good.Key, End: good.End, Start: good.Start, PrevKV: good.PrevKV, Complete: good.Complete}
		w.Resps = make([]Response, len(good.Resps))
		for i, r := range good.Resps {
			w.Resps[i] = Response{Progress: r.Progress, Header: r.Header, Events: append([]Event(nil), r.Events...)}
		}
		f(&w)
		if errs := CheckWatch(&w, ref); len(errs) == 0 {
			t.Errorf("%s: not detected", name)
		}
	}
	// The reference must hold every acknowledged write.
	var ops []Op
	for i, v := range []string{"1", "2", "3", "5"} {
		ops = append(ops, op(0, int64(i), int64(i), Input{Kind: Put, Key: "k", Value: v}, Output{Unknown: true}))
	}
	if errs := CheckHistory(ref, ops); len(errs) != 0 {
		t.Fatalf("complete history: %v", errs)
	}
	ops = append(ops, op(0, 0, 1, Input{Kind: Put, Key: "z", Value: "9"}, Output{Rev: 5, OK: true}))
	if errs := CheckHistory(ref, ops); len(errs) != 1 || !strings.Contains(errs[0].Error(), "missing") {
		t.Errorf("a lost acknowledged write was not detected: %v", errs)
	}
	if errs := CheckHistory(ref, ops[:2]); len(errs) == 0 {
		t.Error("values never written were not detected")
	}
}
