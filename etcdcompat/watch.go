package etcdcompat

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"time"

	"github.com/brainkv/brain/internal/rpccodec"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// etcd's watch errors (storage/mvcc), used as cancel reasons.
const (
	reasonEmptyRange  = "mvcc: watcher range is empty"
	reasonDuplicateID = "mvcc: duplicate watch ID provided on the WatchStream"
)

type watchServer struct {
	pb.UnimplementedWatchServer
	s *Server
}

// watcher is one watch on a stream. Owned by the stream's send loop.
type watcher struct {
	id       int64
	key, end []byte // end nil: single key; empty: unbounded
	shape    shape
	fragment bool
	progress bool
	start    int64 // the revision the watch was created to start at
	asked    int64 // the start revision the client asked for (0: from now)
	next     int64 // next revision to deliver: every event below it was sent
	sent     bool  // something was sent since the last progress tick
}

// watchStream is one gRPC Watch stream: a receive goroutine turning
// requests into control messages, and a send loop that owns the watchers
// and is the only writer to the stream.
type watchStream struct {
	s      *Server
	stream pb.Watch_WatchServer
	reqs   chan control

	watchers map[int64]*watcher
	nextID   int64
	// progressTarget is the revision a RequestProgress waits for (0: none).
	progressTarget int64
	// lastHeader is the highest header revision sent on the stream.
	lastHeader int64
	// retryIn is the wait before the next delivery attempt after an
	// event-log read failed for a transient reason (0: none failed).
	retryIn time.Duration
}

// Waits between delivery attempts of a watcher whose event-log read failed
// for want of a leader: a partition's leader is being elected (a node
// restarted) or its replicas are down. The watch stays open and stalls,
// as an etcd watch does while its cluster has no leader.
const (
	minCatchupRetry = 50 * time.Millisecond
	maxCatchupRetry = 2 * time.Second
)

// errCatchupLater reports that a watcher's event-log read failed for a
// reason that passes (the watcher keeps its place and reads again).
var errCatchupLater = errors.New("etcdcompat: event-log read failed; retrying")

// Watch serves one watch stream. A stream with the "hasleader" metadata
// was admitted by the stream interceptor (leaderWatch), which cancels its
// context with "no leader" if the node loses its leader for long.
func (ws *watchServer) Watch(stream pb.Watch_WatchServer) error {
	sws := &watchStream{
		s: ws.s, stream: stream,
		reqs:     make(chan control, 64),
		watchers: make(map[int64]*watcher),
	}
	recvErr := make(chan error, 1)
	go func() { recvErr <- sws.recvLoop() }()
	err := sws.sendLoop(recvErr)
	for _, w := range sws.watchers {
		ws.s.hub.watchRemoved(w.key, w.end)
	}
	return toGRPCError(err)
}

// control is a request from the client for the send loop, with the
// store's revision when it arrived where the request needs one.
type control struct {
	req *pb.WatchRequest
	// rev is the current revision when the request was received, for
	// creates (where "now" starts) and progress requests (what their
	// answer must cover). etcd reads it in its receive loop too: read in
	// the send loop, after it delivered events the client then acted on,
	// it would also cover revisions written after the request (a watch
	// cache would report a revision it was never asked about).
	rev int64
}

func (sws *watchStream) recvLoop() error {
	for {
		req, err := sws.stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		c := control{req: req}
		switch uv := req.RequestUnion.(type) {
		case *pb.WatchRequest_CreateRequest:
			c.rev = sws.s.currentRevision(sws.stream.Context())
		case *pb.WatchRequest_ProgressRequest:
			if uv.ProgressRequest != nil {
				c.rev = sws.s.currentRevision(sws.stream.Context())
			}
		}
		select {
		case sws.reqs <- c:
		case <-sws.stream.Context().Done():
			return nil
		}
	}
}

func (sws *watchStream) header(rev int64) *pb.ResponseHeader {
	h := &pb.ResponseHeader{Revision: rev}
	sws.s.fill(h)
	h.Revision = rev
	return h
}

func (sws *watchStream) sendLoop(recvErr <-chan error) error {
	ctx := sws.stream.Context()
	ticker := time.NewTicker(sws.s.cfg.ProgressNotifyInterval)
	defer ticker.Stop()
	var retry <-chan time.Time
	for {
		frontier, changed := sws.s.hub.Frontier()
		failed := false
		for _, w := range sws.watchers {
			if err := sws.deliver(w, frontier); errors.Is(err, errCatchupLater) {
				failed = true
			} else if err != nil {
				return err
			}
		}
		retry = sws.scheduleRetry(failed)
		if err := sws.maybeProgress(); err != nil {
			return err
		}
		select {
		case <-retry:
		case <-ctx.Done():
			if errors.Is(context.Cause(ctx), rpctypes.ErrGRPCStopped) {
				sws.lastWord()
			}
			return watchCtxErr(ctx, ctx.Err())
		case err := <-recvErr:
			if err != nil {
				return watchCtxErr(ctx, err)
			}
			recvErr = nil // the client closed its side; keep sending
		case c := <-sws.reqs:
			if err := sws.handle(c); err != nil {
				return err
			}
		case <-changed:
		case <-ticker.C:
			if err := sws.progressTick(); err != nil {
				return err
			}
		}
	}
}

// lastWord is what a stream says before its node stops: every watcher
// that asked for progress notifications is brought up to the frontier and
// gets one, at the revision it was sent everything up to. etcd's client
// resumes a broken watch on another node from the revision after the last
// response it saw; a watch of a quiet range (most of kube-apiserver's
// resources) would resume from the revision of its last event, long
// compacted (kube-apiserver compacts every 5 minutes), fail with
// "required revision has been compacted", and kube-apiserver would
// re-list the resource. With the notification it resumes from now. A
// rolling restart of 3 nodes under kube-apiserver re-listed 55 watch caches
// without it.
func (sws *watchStream) lastWord() {
	frontier, _ := sws.s.hub.Frontier()
	for _, w := range sws.watchers {
		if !w.progress {
			continue
		}
		if err := sws.deliver(w, frontier); err != nil && !errors.Is(err, errCatchupLater) {
			return
		}
		if rev := w.next - 1; rev > 0 {
			if err := sws.send(&pb.WatchResponse{Header: sws.header(rev), WatchId: w.id}); err != nil {
				return
			}
		}
	}
}

// scheduleRetry returns when to attempt delivery again after a round in
// which some watcher's event-log read failed (nil if none did), backing
// off from minCatchupRetry to maxCatchupRetry while reads keep failing.
func (sws *watchStream) scheduleRetry(failed bool) <-chan time.Time {
	if !failed {
		sws.retryIn = 0
		return nil
	}
	sws.retryIn = min(max(2*sws.retryIn, minCatchupRetry), maxCatchupRetry)
	return time.After(sws.retryIn)
}

// watchCtxErr is what a watch stream whose context ended, or whose client
// side failed with err, ends with: "no leader" if leaderWatch cancelled
// it, etcd's "watch canceled" for a cancelled context.
func watchCtxErr(ctx context.Context, err error) error {
	if err = streamCause(ctx, err); errors.Is(err, errContextCanceled) {
		return rpctypes.ErrGRPCWatchCanceled
	}
	return err
}

func (sws *watchStream) send(resp *pb.WatchResponse) error {
	sws.lastHeader = max(sws.lastHeader, resp.Header.GetRevision())
	sws.s.hub.frames.Inc()
	return sws.stream.Send(resp)
}

func (sws *watchStream) handle(c control) error {
	switch uv := c.req.RequestUnion.(type) {
	case *pb.WatchRequest_CreateRequest:
		if uv.CreateRequest != nil {
			return sws.create(uv.CreateRequest, c.rev)
		}
	case *pb.WatchRequest_CancelRequest:
		if uv.CancelRequest != nil {
			id := uv.CancelRequest.WatchId
			if w, ok := sws.watchers[id]; ok {
				delete(sws.watchers, id)
				sws.s.hub.watchRemoved(w.key, w.end)
				return sws.send(&pb.WatchResponse{Header: sws.header(sws.s.currentRevision(sws.stream.Context())), WatchId: id, Canceled: true})
			}
		}
	case *pb.WatchRequest_ProgressRequest:
		if uv.ProgressRequest != nil {
			target := c.rev
			for _, w := range sws.watchers {
				if w.asked > target {
					// etcd ignores the request while a watch waits for a
					// future start revision it was asked to start at; a
					// watch from now (start 0) is answered at once.
					return nil
				}
			}
			sws.progressTarget = max(sws.progressTarget, target)
			sws.s.store.RequestClose(target)
		}
	}
	return nil
}

// create mirrors etcd's watch creation, including its errors.
func (sws *watchStream) create(creq *pb.WatchCreateRequest, cur int64) error {
	if len(creq.Key) == 0 {
		creq.Key = []byte{0}
	}
	fail := func(reason string) error {
		return sws.send(&pb.WatchResponse{Header: sws.header(cur), WatchId: -1, Created: true, Canceled: true, CancelReason: reason})
	}
	if creq.StartRevision < 0 {
		return fail(rpctypes.ErrCompacted.Error())
	}
	var end []byte
	switch {
	case len(creq.RangeEnd) == 0:
		end = nil
	case len(creq.RangeEnd) == 1 && creq.RangeEnd[0] == 0:
		end = []byte{}
	default:
		end = creq.RangeEnd
	}
	if a := sws.s.cfg.Auth; a != nil {
		if err := a.Fresh(sws.stream.Context()); err != nil {
			return fail(toGRPCError(err).Error())
		}
		if reason := a.WatchCancelReason(sws.stream.Context(), creq.Key, end); reason != "" {
			return fail(reason)
		}
	}
	if len(end) != 0 && bytes.Compare(creq.Key, end) != -1 {
		return fail(reasonEmptyRange)
	}
	id := creq.WatchId
	if id == 0 {
		for sws.watchers[sws.nextID] != nil {
			sws.nextID++
		}
		id = sws.nextID
		sws.nextID++
	} else if _, ok := sws.watchers[id]; ok {
		return fail(reasonDuplicateID)
	}
	w := &watcher{
		id: id, key: creq.Key, end: end,
		fragment: creq.Fragment, progress: creq.ProgressNotify,
		next: creq.StartRevision,
	}
	if w.next == 0 {
		w.next = cur + 1
	}
	w.start, w.asked = w.next, creq.StartRevision
	w.shape = shape{key: string(creq.Key), end: string(end), single: end == nil, prevKV: creq.PrevKv}
	for _, f := range creq.Filters {
		switch f {
		case pb.WatchCreateRequest_NOPUT:
			w.shape.noPut = true
		case pb.WatchCreateRequest_NODELETE:
			w.shape.noDelete = true
		}
	}
	if err := sws.send(&pb.WatchResponse{Header: sws.header(cur), WatchId: id, Created: true}); err != nil {
		return err
	}
	sws.watchers[id] = w
	// Before the send loop reads the frontier: the partitions the watch
	// covers are merged from here on.
	sws.s.hub.watchAdded(w.key, w.end)
	if frontier, _ := sws.s.hub.Frontier(); w.next <= cur && frontier < cur {
		// A watch from the past is owed everything up to now. The hub asks
		// idle partitions to close only for events it holds; after a
		// restart, with no write since, nothing else would move the
		// frontier past what the partitions had closed.
		sws.s.hub.src.RequestCloseSoon(cur, sws.s.hub.isPaused)
	}
	return nil
}

// shapeAt is the shape to encode w's events of revision rev with. As in
// etcd, which reads an event's prev_kv at revision-1 when it sends it, an
// event whose previous revision is compacted has no prev_kv.
func (w *watcher) shapeAt(rev, compact int64) *shape {
	if w.shape.prevKV && rev-1 < compact {
		s := w.shape
		s.prevKV = false
		return &s
	}
	return &w.shape
}

// maxFrameBytes is the size at which a frame of several revisions is sent.
const maxFrameBytes = 1 << 20

// frame accumulates the events of consecutive revisions for one watcher.
// Its header revision is the frontier the watcher is being brought up to,
// as etcd reports its current revision in catch-up responses.
type frame struct {
	b      []byte
	buf    *[]byte // the pooled buffer b is in (framebuf.go), nil until the first event
	header int64
	oldest time.Time
}

// grow moves the frame's events to a pooled buffer with room for n bytes.
func (fr *frame) grow(n int) {
	p := getFrameBuf(max(n, 2*cap(fr.b)))
	*p = append(*p, fr.b...)
	fr.release()
	fr.buf, fr.b = p, *p
}

// release gives the frame's buffer back; the frame is empty after.
func (fr *frame) release() {
	if fr.buf != nil {
		putFrameBuf(fr.buf)
		fr.buf = nil
	}
	fr.b = nil
}

// deliver sends w every event up to frontier it has not seen. It returns
// errCatchupLater if an event-log read failed for a passing reason, after
// sending what it had read.
func (sws *watchStream) deliver(w *watcher, frontier int64) error {
	src := sws.s.hub.src // the store
	fr := frame{header: frontier}
	defer fr.release()
	for w.next <= frontier {
		compact := src.CompactRevision()
		if w.next < compact {
			return sws.fellBehind(w, compact)
		}
		entries, ok := sws.s.hub.entries(w.next, frontier)
		if !ok {
			// Behind the ring: read the event logs, then re-check that no
			// compaction removed what we read from.
			sws.s.hub.catchups.Inc()
			evs, next, err := src.Events(w.next, frontier, w.key, w.end, 1024)
			if err != nil {
				if !transient(err) {
					return err
				}
				// Send what this watcher has so far (w.next is past it)
				// and read from w.next again later.
				sws.s.hub.catchupRetries.Inc()
				if err := sws.flush(w, &fr); err != nil {
					return err
				}
				return errCatchupLater
			}
			if c := src.CompactRevision(); w.next < c {
				return sws.fellBehind(w, c)
			}
			for _, re := range evs {
				if enc := encodeEvents(re.Events, w.shapeAt(re.Rev, compact)); len(enc.ends) > 0 {
					if err := sws.add(w, &fr, enc, time.Time{}); err != nil {
						return err
					}
				}
			}
			w.next = next
			continue
		}
		for _, e := range entries {
			if enc := sws.s.hub.encodedFor(e, w.shapeAt(e.rev, compact)); enc != nil {
				if err := sws.add(w, &fr, enc, e.at); err != nil {
					return err
				}
			}
		}
		w.next = frontier + 1
	}
	return sws.flush(w, &fr)
}

// add appends one revision's encoded events to the frame, sending first if
// the frame would grow too large.
func (sws *watchStream) add(w *watcher, fr *frame, enc *encoded, at time.Time) error {
	if len(fr.b) > 0 && len(fr.b)+len(enc.b) > maxFrameBytes {
		if err := sws.flush(w, fr); err != nil {
			return err
		}
	}
	// etcd fragments at its gRPC message limit: --max-request-bytes plus
	// the overhead allowance.
	limit := int(sws.s.cfg.MaxRequestBytes + GRPCOverheadBytes)
	if w.fragment && len(enc.b) >= limit && len(enc.ends) > 1 {
		if err := sws.flush(w, fr); err != nil {
			return err
		}
		return sws.sendFragments(w, fr.header, enc, limit)
	}
	if n := len(fr.b) + len(enc.b); n > cap(fr.b) {
		fr.grow(n)
	}
	fr.b = append(fr.b, enc.b...)
	if fr.oldest.IsZero() {
		fr.oldest = at
	}
	return nil
}

func (sws *watchStream) flush(w *watcher, fr *frame) error {
	if len(fr.b) == 0 {
		return nil
	}
	if err := sws.sendEvents(w, fr.header, fr.b, false); err != nil {
		return err
	}
	if !fr.oldest.IsZero() {
		sws.s.hub.lag.Observe(time.Since(fr.oldest).Seconds())
	}
	fr.b, fr.oldest = fr.b[:0], time.Time{}
	return nil
}

// sendFragments splits one revision's events over several responses, all
// but the last marked Fragment, as etcd's sendFragments does.
func (sws *watchStream) sendFragments(w *watcher, header int64, enc *encoded, limit int) error {
	start := 0
	for i := 0; i < len(enc.ends); {
		j := i + 1
		for j < len(enc.ends) && enc.ends[j]-start < limit {
			j++
		}
		end := enc.ends[j-1]
		if err := sws.sendEvents(w, header, enc.b[start:end], j < len(enc.ends)); err != nil {
			return err
		}
		start, i = end, j
	}
	return nil
}

// sendEvents sends a WatchResponse spliced from pre-encoded events.
func (sws *watchStream) sendEvents(w *watcher, rev int64, events []byte, fragment bool) error {
	hdr, err := sws.header(rev).Marshal()
	if err != nil {
		return err
	}
	// The response goes out in a buffer of gRPC's pool, which gRPC
	// returns there once it has written it: a frame is too large for
	// Go's small-object allocator, and fresh memory for each cost page
	// faults.
	msg := rpccodec.NewPooled(len(hdr) + len(events) + 32)
	b := append(msg.Buf, 1<<3|2)
	b = binary.AppendUvarint(b, uint64(len(hdr)))
	b = append(b, hdr...)
	if w.id != 0 {
		b = append(b, 2<<3)
		b = binary.AppendUvarint(b, uint64(w.id))
	}
	if fragment {
		b = append(b, 7<<3, 1)
	}
	b = append(b, events...)
	w.sent = true
	sws.lastHeader = max(sws.lastHeader, rev)
	sws.s.hub.frames.Inc()
	return sws.stream.SendMsg(msg.Message(b))
}

// fellBehind cancels w, whose next revision compaction removed, counting
// it as a slow watcher if it had been delivering (one created at a
// compacted revision is not slow).
func (sws *watchStream) fellBehind(w *watcher, compact int64) error {
	if w.next > w.start {
		sws.s.hub.slowCancels.Inc()
	}
	return sws.compacted(w, compact)
}

func (sws *watchStream) compacted(w *watcher, compact int64) error {
	delete(sws.watchers, w.id)
	sws.s.hub.watchRemoved(w.key, w.end)
	return sws.send(&pb.WatchResponse{Header: sws.header(0), WatchId: w.id, CompactRevision: compact, Canceled: true})
}

// maybeProgress answers a pending RequestProgress once every watcher has
// been sent everything up to its target.
func (sws *watchStream) maybeProgress() error {
	if sws.progressTarget == 0 {
		return nil
	}
	if len(sws.watchers) == 0 {
		// etcd sends nothing for a stream without watchers.
		sws.progressTarget = 0
		return nil
	}
	covered := int64(-1) // every watcher was sent everything up to it
	for _, w := range sws.watchers {
		if w.next <= sws.progressTarget {
			return nil
		}
		if covered == -1 || w.next-1 < covered {
			covered = w.next - 1
		}
	}
	// Answer with the revision the request was made at, as etcd does,
	// unless the stream already showed a later one: then with that (never
	// beyond what every watcher was sent), so header revisions do not go
	// backwards.
	rev := max(sws.progressTarget, min(sws.lastHeader, covered))
	sws.progressTarget = 0
	return sws.send(&pb.WatchResponse{Header: sws.header(rev), WatchId: -1})
}

// progressTick sends progress notifications to watchers that asked for
// them and were sent nothing since the last tick, as etcd does.
func (sws *watchStream) progressTick() error {
	frontier, _ := sws.s.hub.Frontier()
	for _, w := range sws.watchers {
		if w.progress && !w.sent && w.next > frontier {
			if err := sws.send(&pb.WatchResponse{Header: sws.header(w.next - 1), WatchId: w.id}); err != nil {
				return err
			}
		}
		w.sent = false
	}
	return nil
}

var _ = mvccpb.PUT
