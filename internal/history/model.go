package history

import (
	"fmt"
	"sort"

	"github.com/anishathalye/porcupine"
)

// Kind is an operation kind.
type Kind uint8

const (
	Get Kind = iota
	Put
	CAS // put if the key's mod_revision equals ExpectMod (0: absent)
	Delete
)

func (k Kind) String() string { return [...]string{"get", "put", "cas", "delete"}[k] }

// Input is what a client asked.
type Input struct {
	Kind      Kind
	Key       string
	Value     string // Put, CAS; values are unique per history
	ExpectMod int64  // CAS
}

// Output is what the client saw.
type Output struct {
	// Unknown: the request failed or timed out; it may have taken effect.
	Unknown bool
	Err     string
	// Rev is the response's header revision (for writes that took effect,
	// the write's revision).
	Rev int64
	// OK: a CAS that succeeded or a delete that deleted something.
	OK bool
	// Get results.
	Exists bool
	Value  string
	Mod    int64
	// Member is the ID of the member that answered (the response header's
	// member_id), so that a violation names the node behind it; 0 if the
	// request failed.
	Member uint64 `json:",omitempty"`
	// FailedAt is when a failed request returned, on the recorder's clock
	// (an Unknown operation's Return is at infinity for the checkers);
	// availability reports use it.
	FailedAt int64 `json:",omitempty"`
}

// IsWrite reports whether the operation changed the store (as far as the
// client knows).
func (o Op) IsWrite() bool {
	if o.Out.Unknown {
		return false
	}
	switch o.In.Kind {
	case Put:
		return true
	case CAS, Delete:
		return o.Out.OK
	}
	return false
}

// Op is one recorded operation.
type Op struct {
	Client int
	In     Input
	Out    Output
	Call   int64 // nanoseconds since the recorder started
	Return int64
}

// register is the model state of one key. mod is -1 when an operation of
// unknown outcome may have written the key at an unknown revision.
type register struct {
	exists bool
	value  string
	mod    int64
}

func step(s register, in Input, out Output) []register {
	if out.Unknown {
		switch in.Kind {
		case Get:
			return []register{s}
		case Put:
			return []register{s, {exists: true, value: in.Value, mod: -1}}
		case CAS:
			if s.mod == -1 || s.modOrZero() == in.ExpectMod {
				return []register{s, {exists: true, value: in.Value, mod: -1}}
			}
			return []register{s}
		case Delete:
			return []register{s, {}}
		}
	}
	switch in.Kind {
	case Get:
		if out.Exists != s.exists || out.Exists && out.Value != s.value {
			return nil
		}
		if !out.Exists {
			return []register{s}
		}
		if s.mod != -1 && out.Mod != s.mod {
			return nil
		}
		return []register{{exists: true, value: s.value, mod: out.Mod}}
	case Put:
		if s.mod != -1 && out.Rev <= s.mod {
			return nil
		}
		return []register{{exists: true, value: in.Value, mod: out.Rev}}
	case CAS:
		match := s.modOrZero() == in.ExpectMod
		if out.OK {
			if s.mod != -1 && (!match || out.Rev <= s.mod) {
				return nil
			}
			return []register{{exists: true, value: in.Value, mod: out.Rev}}
		}
		if s.mod != -1 && match {
			return nil
		}
		return []register{s}
	case Delete:
		if out.OK != s.exists {
			return nil
		}
		return []register{{}}
	}
	return nil
}

func (s register) modOrZero() int64 {
	if !s.exists {
		return 0
	}
	return s.mod
}

// Model is the porcupine model of a set of registers, partitioned by key.
func Model() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			byKey := map[string][]porcupine.Operation{}
			var keys []string
			for _, op := range h {
				k := op.Input.(Input).Key
				if _, ok := byKey[k]; !ok {
					keys = append(keys, k)
				}
				byKey[k] = append(byKey[k], op)
			}
			sort.Strings(keys)
			out := make([][]porcupine.Operation, len(keys))
			for i, k := range keys {
				out[i] = byKey[k]
			}
			return out
		},
		Init: func() []interface{} { return []interface{}{register{}} },
		Step: func(state, input, output interface{}) []interface{} {
			next := step(state.(register), input.(Input), output.(Output))
			out := make([]interface{}, len(next))
			for i, r := range next {
				out[i] = r
			}
			return out
		},
		DescribeOperation: func(input, output interface{}) string {
			in, out := input.(Input), output.(Output)
			res := ""
			switch {
			case out.Unknown:
				res = "unknown (" + out.Err + ")"
			case in.Kind == Get && out.Exists:
				res = fmt.Sprintf("%q@%d", out.Value, out.Mod)
			case in.Kind == Get:
				res = "absent"
			default:
				res = fmt.Sprintf("ok=%v rev=%d", out.OK, out.Rev)
			}
			if out.Member != 0 {
				res += fmt.Sprintf(" from %x", out.Member)
			}
			switch in.Kind {
			case Put:
				return fmt.Sprintf("put(%s, %q) -> %s", in.Key, in.Value, res)
			case CAS:
				return fmt.Sprintf("cas(%s, mod==%d, %q) -> %s", in.Key, in.ExpectMod, in.Value, res)
			case Delete:
				return fmt.Sprintf("delete(%s) -> %s", in.Key, res)
			}
			return fmt.Sprintf("get(%s) -> %s", in.Key, res)
		},
		DescribeState: func(state interface{}) string {
			s := state.(register)
			if !s.exists {
				return "absent"
			}
			return fmt.Sprintf("%q@%d", s.value, s.mod)
		},
	}
	return nm.ToModel()
}
