package kvapi

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
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
	callEntryResend   = 4 // as a request: one sent on a stream that broke (see callsession.go)
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
	case callEntryRequest, callEntryResend:
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
		case callEntryRequest, callEntryResend:
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

	// ids numbers the calls of every stream of the caller's session (see
	// callsession.go); an ID is taken with mu held, so a stream's calls
	// leave in the order of their IDs.
	ids *atomic.Uint64
	// ready is closed once the node's header arrived (or the stream
	// broke first); incarnation is the node's (0: the node does not keep
	// sessions, an older version). Set before ready closes.
	ready       chan struct{}
	incarnation uint64 // protected by mu

	mu      sync.Mutex
	q       sendQueue               // guarded by mu
	pending map[uint64]*pendingCall // protected by mu
	err     error                   // why the stream broke; protected by mu
	// onBreak, if set, learns how many calls under way a break failed,
	// after and before they were handed to the stream.
	onBreak func(sent, unsent int, err error)
}

type pendingCall struct {
	id       uint64
	body     []byte    // the encoded CallRequest
	deadline time.Time // the caller's (zero: none)
	since    time.Time // when it was first sent
	done     chan struct{}
	sent     bool // handed to the stream
	resp     CallResponse
	err      error
}

// lostCall is the error of a call the node had been sent when its stream
// broke: the Client re-sends it on a new stream (Client.Call).
type lostCall struct {
	node        uint64
	p           *pendingCall
	incarnation uint64 // of the node it was sent to
	cause       error  // why the stream broke
}

func (e *lostCall) Error() string {
	return fmt.Sprintf("kvapi: node %x: call %d lost with its stream: %v", e.node, e.p.id, e.cause)
}

// errCallsUnsupported: the node does not serve the Calls stream.
var errCallsUnsupported = errors.New("kvapi: node does not serve the Calls stream")

// openCallMux opens a Calls stream on conn, of the caller's session
// (numbering its calls with ids).
func openCallMux(node uint64, conn *grpc.ClientConn, session uint64, ids *atomic.Uint64, onBreak func(sent, unsent int, err error)) (*callMux, error) {
	ctx, cancel := context.WithCancel(context.Background())
	sctx := metadata.AppendToOutgoingContext(ctx, mdCallSession, strconv.FormatUint(session, 16))
	st, err := conn.NewStream(sctx, &callsStreamDesc, callsMethod)
	if err != nil {
		cancel()
		return nil, err
	}
	m := &callMux{node: node, conn: conn, stream: st, cancel: cancel, ids: ids, ready: make(chan struct{}), pending: make(map[uint64]*pendingCall), onBreak: onBreak}
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
	p := &pendingCall{body: body, done: make(chan struct{}), since: time.Now()}
	p.deadline, _ = ctx.Deadline()
	return m.submit(ctx, callEntryRequest, p)
}

// resend sends a call a broken stream had carried, under its ID; the node
// answers it, executes it if it never received it, or says it does not
// know its fate (answered as a broken call that was sent).
func (m *callMux) resend(ctx context.Context, lost *lostCall) ([]byte, error) {
	old := lost.p
	p := &pendingCall{id: old.id, body: old.body, deadline: old.deadline, since: old.since, done: make(chan struct{})}
	res, err := m.submit(ctx, callEntryResend, p)
	var un *unavailableError
	if errors.As(err, &un) && errors.Is(un.err, errFateUnknown) {
		return nil, &unavailableError{node: m.node, err: lost.cause}
	}
	return res, err
}

// submit sends p (its ID taken now unless it has one) and waits for its
// answer.
func (m *callMux) submit(ctx context.Context, kind byte, p *pendingCall) ([]byte, error) {
	var timeout time.Duration
	if !p.deadline.IsZero() {
		if timeout = time.Until(p.deadline); timeout <= 0 {
			return nil, &unavailableError{node: m.node, err: status.FromContextError(context.DeadlineExceeded).Err(), notSent: kind == callEntryRequest}
		}
	}
	m.mu.Lock()
	if m.err != nil {
		err := m.err
		m.mu.Unlock()
		return nil, &unavailableError{node: m.node, err: err, notSent: kind == callEntryRequest}
	}
	if p.id == 0 {
		p.id = m.ids.Add(1)
	}
	id := p.id
	m.pending[id] = p
	m.q.out = append(m.q.out, callEntry{kind: kind, id: id, timeout: timeout, body: p.body})
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
				if e.id == id && e.kind == kind {
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
			if p := m.pending[e.id]; p != nil && e.kind != callEntryCancel {
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
	md, err := m.stream.Header()
	if v := md.Get(mdCallIncarnation); err == nil && len(v) == 1 {
		inc, _ := strconv.ParseUint(v[0], 16, 64)
		m.mu.Lock()
		m.incarnation = inc
		m.mu.Unlock()
	}
	close(m.ready)
	if err != nil {
		m.fail(err)
		return
	}
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
		// A stream the node ended cleanly (io.EOF) carried the answer of
		// every call it executed (serveCalls).
		notSent := !p.sent || err == errCallsUnsupported || err == io.EOF
		switch {
		case notSent:
			unsent++
			p.err = &unavailableError{node: m.node, err: err, notSent: true}
		case m.incarnation != 0 && time.Since(p.since) < maxResendAge:
			sent++
			p.err = &lostCall{node: m.node, p: p, incarnation: m.incarnation, cause: err}
		default:
			sent++
			p.err = &unavailableError{node: m.node, err: err}
		}
		close(p.done)
	}
	m.q.out = nil
	m.mu.Unlock()
	m.cancel()
	if m.onBreak != nil && sent+unsent > 0 {
		m.onBreak(sent, unsent, err)
	}
}

// callsStream is the node's side of one Calls stream.
type callsStream struct {
	is   *internalServer
	sess *callSession // nil: the caller has no session (an older version)

	mu      sync.Mutex
	q       sendQueue               // answers to send; guarded by mu
	running map[uint64]*runningCall // protected by mu
	// owed counts the calls received and not yet answered on the stream
	// (is counts them for its drain). Protected by mu.
	owed int
	// ended: the stream is over (it broke, or a newer stream of its
	// session took over); it executes nothing more and its answers go to
	// the session's orphans. Protected by mu.
	ended bool
	// answered is closed, once the node is stopping, when every call
	// received was answered (handed to the stream). Protected by mu.
	answered chan struct{}
	span     receivedSpan // protected by mu
	once     sync.Once
}

type runningCall struct {
	cancel context.CancelFunc
	timed  bool    // the call has a deadline of its own
	orphan *orphan // set when the stream ended with the call under way
}

// end ends the stream once: the calls under way with a deadline run on as
// orphans of the session (the others are cancelled), and so do answers
// not yet sent.
func (st *callsStream) end() {
	st.once.Do(func() {
		st.mu.Lock()
		st.ended = true
		left := st.owed
		st.owed = 0
		var orphans map[uint64]*orphan
		if st.sess != nil {
			now := time.Now()
			orphans = make(map[uint64]*orphan, len(st.running)+len(st.q.out))
			for id, rc := range st.running {
				if rc.timed {
					rc.orphan = &orphan{done: make(chan struct{})}
					orphans[id] = rc.orphan
				} else {
					rc.cancel()
				}
			}
			for _, e := range st.q.out {
				orphans[e.id] = answeredOrphan(e.body, now)
			}
			st.span.ended = now
		}
		st.q.out = nil
		span := st.span
		st.mu.Unlock()
		st.is.end(left)
		if st.sess != nil {
			st.is.sessions.detach(st.sess, st, span, orphans)
		}
	})
}

// serveCalls serves a Calls stream: every call runs on one of the node's
// call workers (calls do not wait for each other) and its answer joins the
// next frame back.
func (is *internalServer) serveCalls(stream grpc.ServerStream) error {
	// An open stream holds the drain: a stopping node closes its peer
	// connections only after each stream ended cleanly.
	is.begin(1)
	defer is.end(1)
	if is.stopping.Load() {
		return nil // nothing sent on it was received
	}
	ctx, cancelAll := context.WithCancel(stream.Context())
	defer cancelAll()
	st := &callsStream{is: is, running: make(map[uint64]*runningCall)}
	st.q = newSendQueue(&st.mu)
	if id := sessionOf(ctx); id != 0 {
		st.sess = is.sessions.attach(id, st)
	}
	defer st.end()
	// The header tells the caller it may re-send calls here after a break.
	if err := stream.SendHeader(metadata.Pairs(mdCallIncarnation, strconv.FormatUint(is.sessions.incarnation, 16))); err != nil {
		return err
	}
	sendErr := make(chan error, 1)
	send := func(m any) error {
		err := stream.SendMsg(m)
		entries := m.(*callFrame).entries
		n := len(entries)
		st.mu.Lock()
		ended := st.ended
		if ended {
			n = 0
		}
		st.owed -= n
		if st.owed == 0 && st.answered != nil {
			close(st.answered)
			st.answered = nil
		}
		st.mu.Unlock()
		is.end(n)
		if err != nil && st.sess != nil {
			// Not sent, or not all of it: the caller may ask again.
			orphans := make(map[uint64]*orphan, len(entries))
			for _, e := range entries {
				orphans[e.id] = answeredOrphan(e.body, time.Now())
			}
			is.sessions.detach(st.sess, nil, receivedSpan{ended: time.Now()}, orphans)
		}
		return err
	}
	go func() {
		if err := st.q.run(ctx, send, nil); err != nil {
			sendErr <- err
			cancelAll()
		}
	}()
	recvErr := make(chan error, 1)
	go func() {
		var f callFrame
		for {
			if err := stream.RecvMsg(&f); err != nil {
				select {
				case err := <-sendErr:
					recvErr <- err
					return
				default:
				}
				if ctx.Err() != nil {
					err = nil
				}
				recvErr <- err
				return
			}
			for _, e := range f.entries {
				if err := st.receive(ctx, e); err != nil {
					recvErr <- err
					return
				}
			}
		}
	}()
	select {
	case err := <-recvErr:
		return err
	case <-is.stopc:
	}
	// The node is stopping: it executes nothing more (execute), and the
	// stream ends once the calls it took are answered. Its caller reads
	// the answers, then the end: the calls it had sent and has no answer
	// for were not executed.
	st.mu.Lock()
	var answered chan struct{}
	if st.owed > 0 {
		answered = make(chan struct{})
		st.answered = answered
	}
	st.mu.Unlock()
	if answered != nil {
		select {
		case <-answered:
		case err := <-recvErr:
			return err
		}
	}
	return nil
}

// receive handles one entry the caller sent.
func (st *callsStream) receive(ctx context.Context, e callEntry) error {
	switch e.kind {
	case callEntryCancel:
		st.mu.Lock()
		if rc := st.running[e.id]; rc != nil {
			rc.cancel()
		}
		st.mu.Unlock()
	case callEntryRequest:
		return st.execute(ctx, e, false)
	case callEntryResend:
		if st.sess == nil {
			st.answer(e.id, fateUnknownBody())
			return nil
		}
		o, received := st.is.sessions.fateOf(st.sess, e.id)
		switch {
		case o != nil:
			go func() {
				select {
				case <-o.done:
					st.answer(e.id, o.body)
				case <-ctx.Done():
				}
			}()
		case received:
			st.answer(e.id, fateUnknownBody())
		default:
			return st.execute(ctx, e, true)
		}
	}
	return nil
}

// answer queues the answer to a re-sent call that the stream does not
// execute, counted as owed like a call's (send takes it off).
func (st *callsStream) answer(id uint64, body []byte) {
	st.is.begin(1) // before send can take it off
	st.mu.Lock()
	queued := !st.ended
	if queued {
		st.q.out = append(st.q.out, callEntry{kind: callEntryResponse, id: id, body: body})
		st.owed++
	}
	st.mu.Unlock()
	if !queued {
		st.is.end(1)
		return
	}
	st.q.signal()
}

// fateUnknownBody is the answer to a re-sent call whose fate the node does
// not know.
func fateUnknownBody() []byte {
	b, _ := (&CallResponse{Code: codeFateUnknown, Msg: errFateUnknown.Error()}).Marshal()
	return b
}

// execute runs a call (re-sent: one a broken stream of the session had
// carried, which no stream received) on one of the node's call workers,
// unless the stream ended (a newer stream of its session took over: the
// caller re-sends it there).
func (st *callsStream) execute(ctx context.Context, e callEntry, resent bool) error {
	is := st.is
	h := is.Handler
	var req CallRequest
	if err := req.unmarshalShared(e.body); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	// A call with a deadline outlives a broken stream of a session (its
	// caller may ask for its answer on the next one).
	parent := ctx
	if st.sess != nil && e.timeout > 0 {
		parent = context.WithoutCancel(ctx)
	}
	var cctx context.Context
	var cancel context.CancelFunc
	if e.timeout > 0 {
		cctx, cancel = context.WithTimeout(parent, e.timeout)
	} else {
		cctx, cancel = context.WithCancel(parent)
	}
	rc := &runningCall{cancel: cancel, timed: e.timeout > 0}
	st.mu.Lock()
	if st.ended || is.stopping.Load() {
		st.mu.Unlock()
		cancel()
		return nil
	}
	switch {
	case resent:
		st.span.resent = append(st.span.resent, e.id)
	case st.span.lo == 0:
		st.span.lo, st.span.hi = e.id, e.id
	default:
		st.span.hi = e.id
	}
	st.running[e.id] = rc
	st.owed++
	st.mu.Unlock()
	is.begin(1)
	id := e.id
	is.calls.Go(func() {
		res, err := h.HandleCall(cctx, &req)
		body, _ := answer(h, &req, res, err).Marshal()
		st.mu.Lock()
		delete(st.running, id)
		ended := st.ended
		if !ended {
			st.q.out = append(st.q.out, callEntry{kind: callEntryResponse, id: id, body: body})
		}
		st.mu.Unlock()
		cancel()
		if ended {
			if rc.orphan != nil {
				is.sessions.resolve(rc.orphan, body)
			}
			return
		}
		st.q.signal()
	})
	return nil
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
