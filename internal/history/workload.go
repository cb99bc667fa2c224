package history

import "math/rand"

// Workload generates one client's random operations on a set of keys. Its
// CAS operations compare with the mod revision the client last saw for the
// key, as kube-apiserver's updates do, so they mostly succeed under low
// contention and race realistically under high.
type Workload struct {
	keys          []string
	get, put, cas int // percentages; the rest are deletes
	rng           *rand.Rand
	mods          map[string]int64
}

// NewWorkload returns a workload over keys with the given percentages of
// gets, puts and CAS operations (the rest are deletes).
func NewWorkload(seed int64, keys []string, get, put, cas int) *Workload {
	return &Workload{keys: keys, get: get, put: put, cas: cas, rng: rand.New(rand.NewSource(seed)), mods: map[string]int64{}}
}

// Next returns the next operation; value must be unique in the history.
func (w *Workload) Next(value string) Input {
	key := w.keys[w.rng.Intn(len(w.keys))]
	in := Input{Key: key, Value: value}
	switch r := w.rng.Intn(100); {
	case r < w.get:
		in.Kind = Get
	case r < w.get+w.put:
		in.Kind = Put
	case r < w.get+w.put+w.cas:
		in.Kind, in.ExpectMod = CAS, w.mods[key]
	default:
		in.Kind = Delete
	}
	return in
}

// Observe records what an operation showed of its key's mod revision.
func (w *Workload) Observe(in Input, out Output) {
	switch {
	case out.Unknown:
	case in.Kind == Get && out.Exists:
		w.mods[in.Key] = out.Mod
	case in.Kind == Get, in.Kind == Delete:
		w.mods[in.Key] = 0
	case out.OK:
		w.mods[in.Key] = out.Rev
	}
}
