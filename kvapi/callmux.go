package kvapi

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Internal calls travel on one long-lived bidirectional stream per pair of
// nodes (Calls) instead of one gRPC unary call each. A unary call costs
// its own HTTP/2 stream on both sides: header frames encoded and decoded,
// a server goroutine and stream state, and at least one write system call
// for the request and one for the answer. On the Calls stream a frame
// carries every call (or answer) queued since the sender last wrote, so a
// busy node forwarding hundreds of writes a second to a leader pays for a
// few frames instead of hundreds of streams.
//
// Semantics are the unary call's: the caller's deadline travels with the
// call and bounds the handler's context there; a caller that gives up
// sends a cancel, which cancels that context; a broken stream fails every
// call under way as unavailable (one not yet handed to the stream as never
// sent, so a write may be retried elsewhere). A node whose peer does not
// serve Calls (an older version) goes back to unary calls.

// streamed reports whether op travels on the Calls stream. Reads, whose
// answers can be large (a scan of a whole partition, a range of events),
// stay unary calls: gRPC interleaves streams, while on the Calls stream a
// large answer would hold up every answer queued behind it.
func streamed(op Op) bool {
	switch op {
	case OpReadTxn, OpScan, OpEvents, OpLeaseKeys:
		return false
	}
	return true
}

var callsStreamDesc = grpc.StreamDesc{StreamName: "Calls", ServerStreams: true, ClientStreams: true}

const callsMethod = "/" + internalServiceName + "/Calls"

// Entry kinds of a call frame.
const (
	callEntryRequest  = 1 // id, timeout (µs, 0: none), CallRequest
	callEntryResponse = 2 // id, CallResponse
	callEntryCancel   = 3 // id
)

// maxCallFrame bounds the calls (or answers) a sender packs into one
// frame; a single larger entry travels alone.
const maxCallFrame = 1 << 20

// callFrame is one message of the Calls stream: a sequence of entries.
type callFrame struct {
	entries []callEntry
}

type callEntry struct {
	kind    byte
	id      uint64
	timeout time.Duration // requests
	body    []byte        // an encoded CallRequest or CallResponse
}

// BrainMessage marks an internal message (rpccodec).
func (*callFrame) BrainMessage() {}

// Marshal encodes the frame as one slice.
func (f *callFrame) Marshal() ([]byte, error) {
	var b []byte
	for _, p := range f.MarshalScattered() {
		b = append(b, p...)
	}
	return b, nil
}

// MarshalScattered encodes the frame as slices: the entries' headers and
// their bodies, which are not copied (rpccodec.Scattered).
func (f *callFrame) MarshalScattered() [][]byte {
	hdr := make([]byte, 0, len(f.entries)*(1+3*binary.MaxVarintLen64))
	ends := make([]int, len(f.entries)) // where each entry's header ends in hdr
	for i, e := range f.entries {
		hdr = appendEntryHeader(hdr, e)
		ends[i] = len(hdr)
	}
	parts := make([][]byte, 0, 2*len(f.entries))
	start := 0
	for i, e := range f.entries {
		parts = append(parts, hdr[start:ends[i]:ends[i]])
		if len(e.body) > 0 {
			parts = append(parts, e.body)
		}
		start = ends[i]
	}
	return parts
}

// appendEntryHeader appends e's kind, id, timeout and body length.
func appendEntryHeader(b []byte, e callEntry) []byte {
	b = append(b, e.kind)
	b = binary.AppendUvarint(b, e.id)
	switch e.kind {
	case callEntryRequest:
		// Rounded up: a deadline under a microsecond away is not none.
		b = binary.AppendUvarint(b, uint64((e.timeout+time.Microsecond-1)/time.Microsecond))
		fallthrough
	case callEntryResponse:
		b = binary.AppendUvarint(b, uint64(len(e.body)))
	}
	return b
}

// Unmarshal decodes a frame; its entries' bodies share b (a received
// message's buffer is the receiver's own).
func (f *callFrame) Unmarshal(b []byte) error {
	d := reader{b: b}
	f.entries = f.entries[:0]
	for len(d.b) > 0 && d.err == nil {
		e := callEntry{kind: d.byte(), id: d.uvarint()}
		switch e.kind {
		case callEntryRequest:
			e.timeout = time.Duration(d.uvarint()) * time.Microsecond
			fallthrough
		case callEntryResponse:
			e.body = d.chunk()
		case callEntryCancel:
		default:
			return errCorruptCall
		}
		f.entries = append(f.entries, e)
	}
	return d.err
}

// take removes from q the entries of the next frame: all of them, or as
// many as fit in maxCallFrame (at least one).
func take(q *[]callEntry) []callEntry {
	size, n := 0, 0
	for n < len(*q) {
		size += len((*q)[n].body) + 16
		if n > 0 && size > maxCallFrame {
			break
		}
		n++
	}
	out := append([]callEntry(nil), (*q)[:n]...)
	*q = append((*q)[:0], (*q)[n:]...)
	return out
}

// sendQueue is what one side of a Calls stream has to send, and the loop
// that sends it: each time it is signalled, everything queued, a frame
// (take) at a time.
type sendQueue struct {
	mu   *sync.Mutex // the owner's lock; guards out
	out  []callEntry // queued; protected by mu
	wake chan struct{}
}

func newSendQueue(mu *sync.Mutex) sendQueue {
	return sendQueue{mu: mu, wake: make(chan struct{}, 1)}
}

// signal tells run there is something queued (call it after adding to out
// and unlocking mu).
func (q *sendQueue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// run sends frames with send until ctx ends (it returns nil) or a send
// fails (it returns the error). taken, if not nil, runs with mu held on
// each frame's entries as they leave the queue.
func (q *sendQueue) run(ctx context.Context, send func(any) error, taken func([]callEntry)) error {
	for {
		select {
		case <-q.wake:
		case <-ctx.Done():
			return nil
		}
		// Let every goroutine that is ready to run add its entry first.
		// The wake-up made this one the next to run (Go's scheduler runs
		// a goroutine readied by a channel send right after the sender
		// parks), so without the yield a frame would carry the one entry
		// that woke it: measured with 64 callers on one thread
		// (BenchmarkCall -cpu 1), 0.97 frames per call without it, 0.03
		// with it, and a quarter of the CPU per call. When nothing else
		// is ready to run, Gosched returns at once.
		runtime.Gosched()
		for {
			q.mu.Lock()
			if len(q.out) == 0 {
				q.mu.Unlock()
				break
			}
			f := callFrame{entries: take(&q.out)}
			if taken != nil {
				taken(f.entries)
			}
			q.mu.Unlock()
			if err := send(&f); err != nil {
				return err
			}
		}
	}
}

// callMux is a caller's Calls stream to one node.
type callMux struct {
	node   uint64
	conn   *grpc.ClientConn
	stream grpc.ClientStream
	cancel context.CancelFunc

	mu      sync.Mutex
	q       sendQueue               // guarded by mu
	nextID  uint64                  // protected by mu
	pending map[uint64]*pendingCall // protected by mu
	err     error                   // why the stream broke; protected by mu
	// onBreak, if set, learns how many calls under way a break failed,
	// after and before they were handed to the stream.
	onBreak func(sent, unsent int, err error)
}

type pendingCall struct {
	done chan struct{}
	sent bool // handed to the stream
	resp CallResponse
	err  error
}

// errCallsUnsupported: the node does not serve the Calls stream.
var errCallsUnsupported = errors.New("kvapi: node does not serve the Calls stream")

// openCallMux opens a Calls stream on conn.
func openCallMux(node uint64, conn *grpc.ClientConn, onBreak func(sent, unsent int, err error)) (*callMux, error) {
	ctx, cancel := context.WithCancel(context.Background())
	st, err := conn.NewStream(ctx, &callsStreamDesc, callsMethod)
	if err != nil {
		cancel()
		return nil, err
	}
	m := &callMux{node: node, conn: conn, stream: st, cancel: cancel, pending: make(map[uint64]*pendingCall), onBreak: onBreak}
	m.q = newSendQueue(&m.mu)
	go m.send(ctx)
	go m.receive()
	return m, nil
}

// broken reports whether the stream failed.
func (m *callMux) broken() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err != nil
}

// call executes req on the node.
func (m *callMux) call(ctx context.Context, req *CallRequest) ([]byte, error) {
	body, _ := req.Marshal()
	var timeout time.Duration
	if dl, ok := ctx.Deadline(); ok {
		if timeout = time.Until(dl); timeout <= 0 {
			return nil, &unavailableError{node: m.node, err: status.FromContextError(context.DeadlineExceeded).Err()}
		}
	}
	p := &pendingCall{done: make(chan struct{})}
	m.mu.Lock()
	if m.err != nil {
		err := m.err
		m.mu.Unlock()
		return nil, &unavailableError{node: m.node, err: err, notSent: true}
	}
	m.nextID++
	id := m.nextID
	m.pending[id] = p
	m.q.out = append(m.q.out, callEntry{kind: callEntryRequest, id: id, timeout: timeout, body: body})
	m.mu.Unlock()
	m.q.signal()
	select {
	case <-p.done:
		if p.err != nil {
			return nil, p.err
		}
		return p.resp.Result, fromCode(&p.resp)
	case <-ctx.Done():
	}
	m.mu.Lock()
	if _, ok := m.pending[id]; ok {
		delete(m.pending, id)
		if p.sent {
			m.q.out = append(m.q.out, callEntry{kind: callEntryCancel, id: id})
		} else {
			for i, e := range m.q.out {
				if e.id == id && e.kind == callEntryRequest {
					m.q.out = append(m.q.out[:i], m.q.out[i+1:]...)
					break
				}
			}
		}
	}
	m.mu.Unlock()
	m.q.signal()
	select {
	case <-p.done: // answered (or failed) meanwhile
		if p.err != nil {
			return nil, p.err
		}
		return p.resp.Result, fromCode(&p.resp)
	default:
	}
	return nil, &unavailableError{node: m.node, err: status.FromContextError(ctx.Err()).Err()}
}

// send writes what is queued until the stream ends; a failed send fails
// the stream.
func (m *callMux) send(ctx context.Context) {
	err := m.q.run(ctx, m.stream.SendMsg, func(entries []callEntry) {
		for _, e := range entries {
			if p := m.pending[e.id]; p != nil && e.kind == callEntryRequest {
				p.sent = true
			}
		}
	})
	if err != nil && err != io.EOF { // io.EOF: the stream ended; receive learns why
		m.fail(err)
	}
}

// receive delivers answers until the stream ends.
func (m *callMux) receive() {
	var f callFrame
	for {
		if err := m.stream.RecvMsg(&f); err != nil {
			m.fail(err)
			return
		}
		m.mu.Lock()
		for _, e := range f.entries {
			p := m.pending[e.id]
			if p == nil || e.kind != callEntryResponse {
				continue // given up by its caller
			}
			delete(m.pending, e.id)
			if err := p.resp.unmarshalShared(e.body); err != nil {
				p.err = &unavailableError{node: m.node, err: err}
			}
			close(p.done)
		}
		m.mu.Unlock()
	}
}

// fail ends the stream: every call under way fails as unavailable.
func (m *callMux) fail(err error) {
	if status.Code(err) == codes.Unimplemented {
		err = errCallsUnsupported
	}
	m.mu.Lock()
	if m.err == nil {
		m.err = err
	}
	sent, unsent := 0, 0
	for id, p := range m.pending {
		delete(m.pending, id)
		notSent := !p.sent || err == errCallsUnsupported
		if notSent {
			unsent++
		} else {
			sent++
		}
		p.err = &unavailableError{node: m.node, err: err, notSent: notSent}
		close(p.done)
	}
	m.q.out = nil
	m.mu.Unlock()
	m.cancel()
	if m.onBreak != nil && sent+unsent > 0 {
		m.onBreak(sent, unsent, err)
	}
}

// serveCalls serves a Calls stream: every call runs on one of the node's
// call workers (calls do not wait for each other) and its answer joins the
// next frame back.
func (is *internalServer) serveCalls(stream grpc.ServerStream) error {
	h := is.Handler
	ctx, cancelAll := context.WithCancel(stream.Context())
	defer cancelAll()
	var (
		mu      sync.Mutex
		cancels = make(map[uint64]context.CancelFunc) // protected by mu
		q       = newSendQueue(&mu)
		sendErr = make(chan error, 1)
		// owed counts the calls received and not yet answered on the
		// stream (is counts them for its drain); ended: the stream is
		// over, its calls' answers are dropped. Both protected by mu.
		owed  int
		ended bool
	)
	defer func() {
		mu.Lock()
		ended = true
		left := owed
		owed = 0
		mu.Unlock()
		is.end(left)
	}()
	send := func(m any) error {
		err := stream.SendMsg(m)
		n := len(m.(*callFrame).entries)
		mu.Lock()
		if ended {
			n = 0
		}
		owed -= n
		mu.Unlock()
		is.end(n)
		return err
	}
	go func() {
		if err := q.run(ctx, send, nil); err != nil {
			sendErr <- err
			cancelAll()
		}
	}()
	var f callFrame
	for {
		if err := stream.RecvMsg(&f); err != nil {
			select {
			case err := <-sendErr:
				return err
			default:
			}
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, e := range f.entries {
			switch e.kind {
			case callEntryCancel:
				mu.Lock()
				if c := cancels[e.id]; c != nil {
					c()
				}
				mu.Unlock()
			case callEntryRequest:
				var req CallRequest
				if err := req.unmarshalShared(e.body); err != nil {
					return status.Error(codes.InvalidArgument, err.Error())
				}
				var cctx context.Context
				var cancel context.CancelFunc
				if e.timeout > 0 {
					cctx, cancel = context.WithTimeout(ctx, e.timeout)
				} else {
					cctx, cancel = context.WithCancel(ctx)
				}
				mu.Lock()
				cancels[e.id] = cancel
				owed++
				mu.Unlock()
				is.begin(1)
				id := e.id
				is.calls.Go(func() {
					res, err := h.HandleCall(cctx, &req)
					body, _ := answer(h, &req, res, err).Marshal()
					mu.Lock()
					delete(cancels, id)
					if !ended {
						q.out = append(q.out, callEntry{kind: callEntryResponse, id: id, body: body})
					}
					mu.Unlock()
					cancel()
					q.signal()
				})
			}
		}
	}
}

// answer is the response to req: its result, or its error's code.
func answer(h Handler, req *CallRequest, res []byte, err error) *CallResponse {
	resp := &CallResponse{Result: res}
	if err != nil {
		resp.Code, resp.Msg = toCode(err)
		if resp.Code == codeNotLeader {
			resp.Leader = h.LeaderOf(req.Group)
		}
	}
	return resp
}
