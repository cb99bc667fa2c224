package kvapi

import (
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/brainkv/brain/partition"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Partition feeds.
//
// Every node's watch hub consumes one feed subscription per partition
// (partition.Subscription): on the node's own replica when it has one, and
// otherwise on a replica of another node through the Feed stream of the
// internal service. A feeder goroutine per partition keeps the
// subscription alive: when it ends (the replica installed a snapshot, was
// removed, its node died, the stream broke) it resubscribes - locally if a
// replica is here now, else on another node - from the closed revision the
// hub holds, and the hub drops the events it already has. So a watch sees
// no gap and no duplicate across any of these. A partition's feed runs
// only while the hub wants it (a watch on the node covers the partition;
// see etcdcompat's hubidle.go); one that resumes starts at its source's
// closed revision and leaves what it skipped to the event logs
// (Truncate). A partition split off another is learned from its parent's
// feed (which the hub merges while any watch meets the span the parent
// had before it split), with the span it was created with.

// FeedSink is what feeders deliver into (the watch hub).
type FeedSink interface {
	partition.Feed
	// ResumeFrom returns the revision a partition's feed must resume from:
	// the sink has every event of it below.
	ResumeFrom(pid uint64) int64
	// Truncate says a partition's events below rev are compacted away or
	// were skipped (they are in the event logs, not in the feed).
	Truncate(pid uint64, rev int64)
	// Wanted says whether partition pid's feed should run now (a watch
	// covers it), and returns a channel closed when the sink's demand
	// next changes.
	Wanted(pid uint64) (bool, <-chan struct{})
	// AddPartition registers a partition created by a split, with the
	// span [start, end) and the closed revision it started at; the sink
	// must hold its parent's feed at or below that revision until it is
	// called (feeders call it before delivering anything of a
	// subscription that carries the split).
	AddPartition(pid uint64, start, end []byte, closed int64)
}

// FeedRequest opens a partition's feed from a revision. From < 0 asks for
// the feed from the serving replica's closed revision on: the stream then
// starts with a Compacted message naming where it starts.
type FeedRequest struct {
	Group uint64
	From  int64
}

// BrainMessage marks an internal message.
func (*FeedRequest) BrainMessage() {}

// Marshal encodes the request.
func (r *FeedRequest) Marshal() ([]byte, error) {
	return binary.AppendVarint(binary.AppendUvarint(nil, r.Group), r.From), nil
}

// Unmarshal decodes the request.
func (r *FeedRequest) Unmarshal(b []byte) error {
	d := reader{b: b}
	r.Group, r.From = d.uvarint(), d.varint()
	return d.err
}

// FeedMessage is one message of a feed stream: events, then the closed
// revision after them (0: unchanged). Compacted, if set, says the events
// below it are gone and the stream starts there. The first message
// carries the partition's splits (partition.Subscription.Splits).
type FeedMessage struct {
	Events    []partition.RevEvents
	Closed    int64
	Compacted int64
	Splits    []partition.SplitRecord
}

// BrainMessage marks an internal message.
func (*FeedMessage) BrainMessage() {}

// Marshal encodes the message.
func (m *FeedMessage) Marshal() ([]byte, error) {
	b := binary.AppendVarint(nil, m.Closed)
	b = binary.AppendVarint(b, m.Compacted)
	b = binary.AppendUvarint(b, uint64(len(m.Splits)))
	for _, r := range m.Splits {
		b = partition.AppendSplitRecord(b, r)
	}
	return appendRevEvents(b, m.Events)
}

// Unmarshal decodes the message.
func (m *FeedMessage) Unmarshal(b []byte) error {
	d := reader{b: b}
	m.Closed, m.Compacted = d.varint(), d.varint()
	n := d.uvarint()
	if d.err != nil {
		return d.err
	}
	if n > uint64(len(d.b)) {
		return errCorruptCall
	}
	rest := d.b
	for i := uint64(0); i < n; i++ {
		r, next, err := partition.ReadSplitRecord(rest)
		if err != nil {
			return errCorruptCall
		}
		m.Splits, rest = append(m.Splits, r), next
	}
	var err error
	m.Events, _, err = readRevEvents(rest)
	return err
}

// appendRevEvents encodes revisions of events, each event marshalled in
// place into b, grown once.
func appendRevEvents(b []byte, revs []partition.RevEvents) ([]byte, error) {
	b = slices.Grow(b, revEventsSize(revs))
	b = binary.AppendUvarint(b, uint64(len(revs)))
	for _, r := range revs {
		b = binary.AppendVarint(b, r.Rev)
		flags := byte(0)
		if r.PrevValuesMissing {
			flags = 1
		}
		b = append(b, flags)
		b = binary.AppendUvarint(b, uint64(len(r.Events)))
		for _, ev := range r.Events {
			n := ev.Size()
			b = binary.AppendUvarint(b, uint64(n))
			start := len(b)
			b = slices.Grow(b, n)[:start+n]
			if _, err := ev.MarshalToSizedBuffer(b[start:]); err != nil {
				return nil, err
			}
		}
	}
	return b, nil
}

// revEventsSize bounds the length of appendRevEvents' encoding of revs
// (every varint counted at its longest).
func revEventsSize(revs []partition.RevEvents) int {
	size := binary.MaxVarintLen64
	for _, r := range revs {
		size += 2*binary.MaxVarintLen64 + 1
		for _, ev := range r.Events {
			size += binary.MaxVarintLen64 + ev.Size()
		}
	}
	return size
}

func readRevEvents(b []byte) ([]partition.RevEvents, []byte, error) {
	d := reader{b: b}
	n := d.uvarint()
	if n > uint64(len(b)) {
		return nil, nil, errCorruptCall
	}
	out := make([]partition.RevEvents, 0, n)
	for i := uint64(0); i < n && d.err == nil; i++ {
		r := partition.RevEvents{Rev: d.varint()}
		r.PrevValuesMissing = d.byte() == 1
		ne := d.uvarint()
		if ne > uint64(len(d.b)) {
			return nil, nil, errCorruptCall
		}
		for j := uint64(0); j < ne && d.err == nil; j++ {
			ev := &mvccpb.Event{}
			if err := ev.Unmarshal(d.chunk()); err != nil {
				return nil, nil, err
			}
			r.Events = append(r.Events, ev)
		}
		out = append(out, r)
	}
	return out, d.b, d.err
}

// feedCatchUpRevs is how many revisions one catch-up message carries.
const feedCatchUpRevs = 256

// maxFeedBacklog bounds the bytes of live events queued for one feed
// stream; a stream that cannot keep up is ended and resubscribes.
const maxFeedBacklog = 64 << 20

var feedStreamDesc = grpc.StreamDesc{StreamName: "Feed", ServerStreams: true}

// ServeFeed implements Handler: it serves a Feed stream from this node's
// replica.
func (s *Store) ServeFeed(stream grpc.ServerStream) error {
	var req FeedRequest
	if err := stream.RecvMsg(&req); err != nil {
		return err
	}
	p := s.Local(req.Group)
	if p == nil {
		return status.Error(codes.NotFound, ErrNoReplica.Error())
	}
	from, first := req.From, &FeedMessage{}
	if from < 0 {
		from = p.Closed() + 1
		first.Compacted = from
	}
	sub, err := p.Subscribe(from)
	var ce *partition.CompactedError
	if errors.As(err, &ce) {
		first.Compacted = ce.Rev
		sub, err = p.Subscribe(ce.Rev)
	}
	if err != nil {
		return status.Error(codes.Unavailable, err.Error())
	}
	defer sub.Cancel()
	first.Splits = sub.Splits()
	if err := stream.SendMsg(first); err != nil {
		return err
	}
	for {
		evs, done, err := sub.CatchUp(feedCatchUpRevs)
		if err != nil {
			return status.Error(codes.Unavailable, err.Error())
		}
		if len(evs) > 0 {
			if err := stream.SendMsg(&FeedMessage{Events: evs}); err != nil {
				return err
			}
		}
		if done {
			break
		}
	}
	if err := stream.SendMsg(&FeedMessage{Closed: sub.Closed()}); err != nil {
		return err
	}
	buf := &feedBuffer{wake: make(chan struct{}, 1)}
	sub.Live(buf)
	ctx := stream.Context()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-sub.Done():
			return status.Error(codes.Unavailable, sub.Err().Error())
		case <-buf.wake:
		}
		msgs, overflow := buf.take()
		if overflow {
			return status.Error(codes.ResourceExhausted, partition.ErrSlowSubscriber.Error())
		}
		for _, m := range msgs {
			for i := range m.Events {
				// This replica applied the events, so it has the previous
				// versions; the receiver's replica may lag behind the
				// stream and must not be asked for them again.
				if r := &m.Events[i]; r.PrevValuesMissing {
					r.PrevValuesMissing = !fillPrevValues(p, r.Events)
				}
			}
			if err := stream.SendMsg(m); err != nil {
				return err
			}
		}
	}
}

// fillPrevValues loads the values of prev_kvs published without them (the
// receiving node may not have the versions) and reports whether it found
// them all. One it cannot read here (the key left the partition in a
// split since) stays without its value for the receiver to look up.
func fillPrevValues(p *partition.Partition, evs []*mvccpb.Event) bool {
	all := true
	for i, ev := range evs {
		if ev.PrevKv == nil {
			continue
		}
		v, err := p.PrevValue(ev.PrevKv.Key, ev.PrevKv.ModRevision)
		if err != nil {
			all = false
			continue
		}
		// Published events are shared with this node's hub: copy.
		c := *ev
		kv := *ev.PrevKv
		kv.Value = v
		c.PrevKv = &kv
		evs[i] = &c
	}
	return all
}

// feedBuffer queues a live subscription's publishes for a stream.
type feedBuffer struct {
	wake chan struct{}

	mu       sync.Mutex
	msgs     []*FeedMessage // protected by mu
	bytes    int            // protected by mu
	overflow bool           // protected by mu
}

// Publish implements partition.Feed (on a raft worker: never blocks).
func (b *feedBuffer) Publish(_ uint64, evs partition.RevEvents, closed int64) {
	b.mu.Lock()
	// What queues while the stream sends goes out in as few messages as
	// feedCatchUpRevs revisions allow. A message's closed revision is
	// delivered after its events; merging moves it only later, past events
	// above it, which it says nothing about.
	var last *FeedMessage
	if len(b.msgs) > 0 {
		last = b.msgs[len(b.msgs)-1]
	}
	switch {
	case b.overflow:
	case evs.Rev == 0 && last != nil:
		last.Closed = max(last.Closed, closed)
	default:
		if last == nil || len(last.Events) >= feedCatchUpRevs {
			last = &FeedMessage{}
			b.msgs = append(b.msgs, last)
		}
		last.Closed = max(last.Closed, closed)
		if evs.Rev != 0 {
			// Copy the event slice: fillPrevValues replaces elements.
			evs.Events = append([]*mvccpb.Event(nil), evs.Events...)
			last.Events = append(last.Events, evs)
			for _, ev := range evs.Events {
				b.bytes += ev.Size()
			}
		}
		b.overflow = b.bytes > maxFeedBacklog
	}
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

func (b *feedBuffer) take() ([]*FeedMessage, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	msgs := b.msgs
	b.msgs, b.bytes = nil, 0
	return msgs, b.overflow
}

// openFeed opens a Feed stream on node.
func (c *Client) openFeed(ctx context.Context, node uint64, req *FeedRequest) (grpc.ClientStream, error) {
	conn, err := c.conn(node)
	if err != nil {
		return nil, err
	}
	st, err := conn.NewStream(ctx, &feedStreamDesc, "/"+internalServiceName+"/Feed")
	if err != nil {
		return nil, err
	}
	if err := st.SendMsg(req); err != nil {
		return nil, err
	}
	if err := st.CloseSend(); err != nil {
		return nil, err
	}
	return st, nil
}

// StartFeeds runs a feeder per partition delivering into sink until Stop;
// feeders of partitions created by splits start when a feeder learns of
// the split. The sink must know every partition's starting point
// (ResumeFrom) already.
func (s *Store) StartFeeds(sink FeedSink) {
	s.feeders.Lock()
	s.feeders.sink = sink
	s.feeders.Unlock()
	for _, rt := range s.table().routes {
		s.ensureFeeder(rt.ID)
	}
}

// ensureFeeder starts partition id's feeder if it does not run.
func (s *Store) ensureFeeder(id uint64) {
	s.feeders.Lock()
	defer s.feeders.Unlock()
	if s.feeders.m[id] || s.feeders.sink == nil {
		return
	}
	s.feeders.m[id] = true
	sink := s.feeders.sink
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.runFeeder(id, sink)
	}()
}

// learnSplits registers the partitions split off a partition with the
// sink and starts their feeders, before anything of the subscription
// that carried the records is delivered.
func (s *Store) learnSplits(recs []partition.SplitRecord, sink FeedSink) {
	for _, r := range recs {
		sink.AddPartition(r.Child, r.Key, r.End, r.Closed)
		s.ensureFeeder(r.Child)
	}
}

// feedRetry is the pause before resubscribing after a failure.
const feedRetry = 50 * time.Millisecond

func (s *Store) runFeeder(id uint64, sink FeedSink) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.stopc
		cancel()
	}()
	var last uint64 // the node whose replica served last (remote)
	skip := false   // resume at the source's closed revision (after idling)
	for ctx.Err() == nil {
		wanted, changed := sink.Wanted(id)
		if !wanted {
			skip = true
			select {
			case <-ctx.Done():
				return
			case <-changed:
			}
			continue
		}
		fctx, fcancel := context.WithCancel(ctx)
		go func() {
			for {
				select {
				case <-changed:
					var wanted bool
					if wanted, changed = sink.Wanted(id); !wanted {
						fcancel()
						return
					}
				case <-fctx.Done():
					return
				}
			}
		}()
		from := sink.ResumeFrom(id)
		var err error
		if p := s.Local(id); p != nil && p.Initialized() {
			err = s.feedLocal(fctx, p, from, &skip, sink)
		} else {
			last, err = s.feedRemote(fctx, id, from, &skip, last, sink)
		}
		stopped := fctx.Err() != nil
		fcancel()
		if ctx.Err() != nil {
			return
		}
		if stopped {
			continue // the sink stopped wanting the feed
		}
		if err != nil && !errors.Is(err, partition.ErrSubscriptionEnded) {
			s.log.Debug("partition feed broke; resubscribing", "partition", id, "from", from, "err", err)
		}
		if err != nil {
			_ = sleep(ctx, feedRetry)
		}
	}
}

// feedLocal feeds sink from this node's replica until the subscription
// ends.
func (s *Store) feedLocal(ctx context.Context, p *partition.Partition, from int64, skip *bool, sink FeedSink) error {
	skipped := *skip
	if skipped {
		from = p.Closed() + 1
	}
	sub, err := p.Subscribe(from)
	var ce *partition.CompactedError
	if errors.As(err, &ce) {
		s.learnSplits(p.Splits(), sink)
		sink.Truncate(p.ID(), ce.Rev)
		*skip = false
		return nil
	}
	if err != nil {
		return err
	}
	defer sub.Cancel()
	s.learnSplits(sub.Splits(), sink)
	if skipped {
		sink.Truncate(p.ID(), from)
		*skip = false
	}
	for {
		evs, done, err := sub.CatchUp(feedCatchUpRevs)
		if err != nil {
			return err
		}
		for _, e := range evs {
			sink.Publish(p.ID(), e, 0)
		}
		if done {
			break
		}
	}
	sink.Publish(p.ID(), partition.RevEvents{}, sub.Closed())
	sub.Live(sink)
	select {
	case <-ctx.Done():
		return nil
	case <-sub.Done():
		return sub.Err()
	}
}

// feedRemote feeds sink from a replica on another node until the stream
// breaks; it returns the node it used.
func (s *Store) feedRemote(ctx context.Context, group uint64, from int64, skip *bool, avoid uint64, sink FeedSink) (uint64, error) {
	if s.rpc == nil {
		return 0, ErrNoReplica
	}
	node, err := s.pickFeedSource(ctx, group, avoid)
	if err != nil {
		return 0, err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if *skip {
		from = -1
	}
	st, err := s.rpc.openFeed(sctx, node, &FeedRequest{Group: group, From: from})
	if err != nil {
		return node, err
	}
	soon := s.slot(group).closeSoon
	for {
		var m FeedMessage
		if err := st.RecvMsg(&m); err != nil {
			return node, err
		}
		s.learnSplits(m.Splits, sink)
		if m.Compacted != 0 {
			sink.Truncate(group, m.Compacted)
		}
		*skip = false
		for _, e := range m.Events {
			s.remoteFeedEvents.Add(int64(len(e.Events)))
			sink.Publish(group, e, 0)
		}
		if m.Closed != 0 {
			sink.Publish(group, partition.RevEvents{}, m.Closed)
			soon.Closed(m.Closed)
		}
		// A local replica, once here, is the cheaper source; switch when
		// it has caught up with what the stream delivered.
		if p := s.Local(group); p != nil && p.Initialized() && p.Closed() >= sink.ResumeFrom(group)-1 {
			return node, nil
		}
	}
}

// RemoteFeedEvents returns how many events this node's partition feeds
// have received from other nodes (the partitions it has no replica of):
// each costs the node a decode on top of what its watch hub spends on an
// event.
func (s *Store) RemoteFeedEvents() int64 { return s.remoteFeedEvents.Load() }

// pickFeedSource chooses a node with a replica of group: a random live
// replica other than avoid (the one that failed last), preferring
// followers so feeds do not load the leader.
func (s *Store) pickFeedSource(ctx context.Context, group, avoid uint64) (uint64, error) {
	info, err := s.GroupInfo(ctx, group)
	if err != nil {
		return 0, err
	}
	var cands []uint64
	for _, n := range append(append([]uint64(nil), info.Voters...), info.Learners...) {
		if n != s.self && n != avoid && (s.alive == nil || s.alive(n)) {
			cands = append(cands, n)
		}
	}
	if len(cands) == 0 {
		if info.Leader != 0 && info.Leader != s.self {
			return info.Leader, nil
		}
		return 0, ErrNoReplica
	}
	rand.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
	for _, n := range cands {
		if n != info.Leader {
			return n, nil
		}
	}
	return cands[0], nil
}
