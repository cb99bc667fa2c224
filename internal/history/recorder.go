package history

import (
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Recorder collects operations from concurrent clients.
type Recorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []Op
}

// NewRecorder starts a recording.
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

// Now returns the recorder's clock.
func (r *Recorder) Now() int64 { return int64(time.Since(r.start)) }

// At converts a wall-clock time to the recorder's clock.
func (r *Recorder) At(t time.Time) int64 { return int64(t.Sub(r.start)) }

// Add records an operation. An operation of unknown outcome is given a
// return time at infinity: it may take effect at any point after its call.
func (r *Recorder) Add(op Op) {
	if op.Out.Unknown {
		if op.Out.FailedAt == 0 {
			op.Out.FailedAt = op.Return
		}
		op.Return = 1 << 62
	}
	r.mu.Lock()
	r.ops = append(r.ops, op)
	r.mu.Unlock()
}

// Ops returns the recorded operations.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Op(nil), r.ops...)
}

// Porcupine converts operations for porcupine.
func Porcupine(ops []Op) []porcupine.Operation {
	out := make([]porcupine.Operation, len(ops))
	for i, op := range ops {
		out[i] = porcupine.Operation{ClientId: op.Client, Input: op.In, Output: op.Out, Call: op.Call, Return: op.Return}
	}
	return out
}

// CheckLinearizable runs porcupine; on failure it writes the visualization
// to htmlPath (if not empty).
//
// The verdict comes from porcupine's plain check, which stops at the first
// key whose history is illegal. The visualization needs the verbose check,
// which explores every key and can take far longer on a broken history, so
// it runs only after a failure and gets at most visualizeTimeout; what it
// found by then is drawn.
func CheckLinearizable(ops []Op, timeout time.Duration, htmlPath string) (porcupine.CheckResult, error) {
	model := Model()
	pops := Porcupine(ops)
	res := porcupine.CheckOperationsTimeout(model, pops, timeout)
	if res != porcupine.Ok && htmlPath != "" {
		_, info := porcupine.CheckOperationsVerbose(model, pops, min(timeout, visualizeTimeout))
		if err := porcupine.VisualizePath(model, info, htmlPath); err != nil {
			return res, err
		}
	}
	return res, nil
}

// visualizeTimeout bounds the verbose porcupine run behind a failure's
// visualization.
const visualizeTimeout = time.Minute
