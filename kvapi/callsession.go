package kvapi

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/metadata"
)

// Calls that outlive their stream. A Calls stream can break while calls
// it carried are under way: the connection between two nodes was closed
// because one of them stopped answering for a while (a paused VM: the
// other side's keepalive gives up after a few seconds), or reset. The
// caller cannot tell a call the node never received from one it executed,
// and a write it cannot place must be answered "leader changed" (it may
// have executed). Sessions let it find out.
//
// Each caller (a Client) names its streams with a session ID, random per
// process, and numbers its calls from one counter, so that the calls to a
// node carry increasing IDs across the streams it opens to it. The node
// remembers, per session and for sessionMemory:
//   - the span of call IDs each ended stream received (in order: a call
//     the caller sent before a later one the node received was received
//     too), and the IDs re-sent on it;
//   - the calls under way when a stream ended (they run on to their own
//     deadlines) and the answers it had not sent: orphans.
//
// A caller whose stream broke opens another and re-sends each call it had
// sent and not had answered (callEntryResend, with its original ID). The
// node answers with the orphan's answer (waiting for it if the call still
// runs); executes the call if no stream received it; and answers
// codeFateUnknown if one did and its answer went out on the broken stream
// (lost on the way), or if the node restarted meanwhile (its incarnation,
// sent in the stream's header, changed). Only the last case leaves a write
// ambiguous, as before.

// Metadata of a Calls stream.
const (
	mdCallSession     = "brain-calls-session"     // caller → node: the session ID (hex)
	mdCallIncarnation = "brain-calls-incarnation" // node → caller, in the header: the node's incarnation (hex)
)

// sessionMemory is how long a node keeps what a session's ended streams
// received and answered. A caller re-sends only calls younger than
// maxResendAge, well inside it.
const (
	sessionMemory = time.Minute
	maxResendAge  = 20 * time.Second
)

// randomID returns a random non-zero ID.
func randomID() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:])
		if v := binary.LittleEndian.Uint64(b[:]); v != 0 {
			return v
		}
	}
}

// sessionOf returns the session ID a Calls stream's caller sent (0: none,
// a caller of an older version).
func sessionOf(ctx context.Context) uint64 {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(mdCallSession); len(v) == 1 {
		if id, err := strconv.ParseUint(v[0], 16, 64); err == nil {
			return id
		}
	}
	return 0
}

// callSessions is what a node remembers of its callers' sessions.
type callSessions struct {
	incarnation uint64 // random per process

	mu sync.Mutex
	m  map[uint64]*callSession // protected by mu
}

func newCallSessions() *callSessions {
	return &callSessions{incarnation: randomID(), m: make(map[uint64]*callSession)}
}

// callSession is one caller's session; its fields are protected by
// callSessions.mu.
type callSession struct {
	live    *callsStream
	spans   []receivedSpan
	floor   uint64 // the highest ID of the spans forgotten
	orphans map[uint64]*orphan
	touched time.Time
}

// receivedSpan is what one ended stream received: the new calls lo..hi
// (0, 0: none) and the re-sent calls it executed.
type receivedSpan struct {
	lo, hi uint64
	resent []uint64
	ended  time.Time
}

// orphan is a call whose stream ended before its answer was sent.
type orphan struct {
	done chan struct{} // closed once body is set
	body []byte        // the encoded CallResponse
	at   time.Time     // when it was answered; protected by callSessions.mu
}

func answeredOrphan(body []byte, now time.Time) *orphan {
	o := &orphan{done: make(chan struct{}), body: body, at: now}
	close(o.done)
	return o
}

// attach makes st the stream serving session id, ending the stream that
// served it before (its caller saw it break and opened st: whatever that
// stream still receives is not executed, and the calls it received are
// known before st's re-sent calls are looked up).
func (cs *callSessions) attach(id uint64, st *callsStream) *callSession {
	cs.mu.Lock()
	now := time.Now()
	cs.gcLocked(now)
	s := cs.m[id]
	if s == nil {
		s = &callSession{orphans: make(map[uint64]*orphan)}
		cs.m[id] = s
	}
	old := s.live
	s.live, s.touched = st, now
	cs.mu.Unlock()
	if old != nil {
		old.end()
	}
	return s
}

// detach records what st received and left unanswered when it ended.
func (cs *callSessions) detach(s *callSession, st *callsStream, span receivedSpan, orphans map[uint64]*orphan) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if s.live == st {
		s.live = nil
	}
	s.touched = span.ended
	if span.hi != 0 || len(span.resent) > 0 {
		s.spans = append(s.spans, span)
	}
	for id, o := range orphans {
		s.orphans[id] = o
	}
}

// resolve records o's answer.
func (cs *callSessions) resolve(o *orphan, body []byte) {
	cs.mu.Lock()
	o.body, o.at = body, time.Now()
	cs.mu.Unlock()
	close(o.done)
}

// fateOf says what became of call id of session s: an orphan (its answer,
// or the call still runs), received (it was, and its answer went out), or
// neither (no stream received it: it may be executed now).
func (cs *callSessions) fateOf(s *callSession, id uint64) (o *orphan, received bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if o := s.orphans[id]; o != nil {
		return o, true
	}
	if id <= s.floor {
		return nil, true // forgotten: not safe to execute again
	}
	for _, sp := range s.spans {
		if (sp.lo <= id && id <= sp.hi) || slices.Contains(sp.resent, id) {
			return nil, true
		}
	}
	return nil, false
}

// gcLocked forgets what is older than sessionMemory.
func (cs *callSessions) gcLocked(now time.Time) {
	for id, s := range cs.m {
		kept := s.spans[:0]
		for _, sp := range s.spans {
			if now.Sub(sp.ended) < sessionMemory {
				kept = append(kept, sp)
			} else {
				s.floor = max(s.floor, sp.hi, slices.Max(append(sp.resent, 0)))
			}
		}
		s.spans = kept
		for oid, o := range s.orphans {
			select {
			case <-o.done:
				if now.Sub(o.at) >= sessionMemory {
					delete(s.orphans, oid)
				}
			default: // still running
			}
		}
		if s.live == nil && len(s.spans) == 0 && len(s.orphans) == 0 && now.Sub(s.touched) >= sessionMemory {
			delete(cs.m, id)
		}
	}
}
