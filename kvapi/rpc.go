package kvapi

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brainkv/brain/internal/peerconn"
	"github.com/brainkv/brain/internal/rpccodec"
	"github.com/brainkv/brain/internal/workers"
	"github.com/brainkv/brain/meta"
	"github.com/brainkv/brain/partition"
	"github.com/brainkv/brain/raftgroup"
	"github.com/brainkv/brain/tso"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The internal API between nodes is one operation, Call: an operation on
// a raft group (a partition, the TSO or the meta group) executed by the
// node that can serve it - usually the group's leader. Calls travel on one
// Calls stream per pair of nodes (callmux.go); the unary gRPC method Call
// serves a joining node, which knows no cluster ID yet, and nodes of an
// older version, which serve no Calls stream. A
// node that cannot answers NotLeader with the leader it knows, and the
// caller retries there. Arguments and results are etcd protobuf messages
// or small binary records; errors travel as codes that map back to the
// packages' sentinel errors, so etcdcompat's error table applies to
// forwarded requests unchanged.

// Op is an internal operation.
type Op uint8

// Operations.
const (
	OpTxn Op = iota + 1
	OpPut
	OpDeleteRange
	OpReadTxn       // rev + TxnRequest, on any replica
	OpScan          // scan at a revision, on any replica
	OpRequestClose  // rev
	OpDeleteByLease // lease
	OpCompact       // rev
	OpLeaseKeys     // lease
	OpPrevValue     // rev + key
	OpTSONext       // n -> first, current
	OpTSOCurrent    // -> current (leadership confirmed)
	OpMetaGrant     // id, ttl -> id, ttl
	OpMetaStartRevoke
	OpMetaFinishRevoke
	OpMetaRenew // id -> ttl
	OpMetaTimeToLive
	OpMetaSetCompact
	OpMetaSetAlarm
	OpMetaReadIndex // -> commit index of the meta group
	OpEvents        // from, to, maxRevs, key, end -> events, next, on any replica
	OpGroupInfo     // -> leader, voters, learners (from the leader)
	OpMetaSetMember // JSON meta.Member
	OpClusterInfo   // -> the cluster's description (Config.ClusterInfo), for a joining node
	OpSplit         // child, key: split a partition (on its leader), then record it in the meta group
	OpMetaAllocPartition
	OpMetaRecordSplits // JSON []meta.Split
	OpMetaAuth         // an etcd InternalRaftRequest (an auth change) -> its response
)

var opNames = [...]string{
	OpTxn: "txn", OpPut: "put", OpDeleteRange: "delete_range", OpReadTxn: "read_txn", OpScan: "scan",
	OpRequestClose: "request_close", OpDeleteByLease: "delete_by_lease", OpCompact: "compact",
	OpLeaseKeys: "lease_keys", OpPrevValue: "prev_value", OpTSONext: "tso_next", OpTSOCurrent: "tso_current",
	OpMetaGrant: "meta_grant", OpMetaStartRevoke: "meta_start_revoke", OpMetaFinishRevoke: "meta_finish_revoke",
	OpMetaRenew: "meta_renew", OpMetaTimeToLive: "meta_time_to_live", OpMetaSetCompact: "meta_set_compact",
	OpMetaSetAlarm: "meta_set_alarm", OpMetaReadIndex: "meta_read_index", OpEvents: "events",
	OpGroupInfo: "group_info", OpMetaSetMember: "meta_set_member", OpClusterInfo: "cluster_info",
	OpSplit: "split", OpMetaAllocPartition: "meta_alloc_partition", OpMetaRecordSplits: "meta_record_splits",
	OpMetaAuth: "meta_auth",
}

// String names the operation (metrics, logs).
func (o Op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return fmt.Sprintf("op%d", uint8(o))
}

// CallRequest is an internal call.
type CallRequest struct {
	Op    Op
	Group uint64
	Args  []byte
}

// BrainMessage marks an internal message (rpccodec).
func (*CallRequest) BrainMessage() {}

// Marshal encodes the request.
func (r *CallRequest) Marshal() ([]byte, error) {
	b := []byte{byte(r.Op)}
	b = binary.AppendUvarint(b, r.Group)
	return append(b, r.Args...), nil
}

// Unmarshal decodes the request.
func (r *CallRequest) Unmarshal(b []byte) error {
	if err := r.unmarshalShared(b); err != nil {
		return err
	}
	r.Args = append([]byte(nil), r.Args...)
	return nil
}

// unmarshalShared decodes the request; its Args share b.
func (r *CallRequest) unmarshalShared(b []byte) error {
	if len(b) < 2 {
		return errCorruptCall
	}
	r.Op = Op(b[0])
	g, n := binary.Uvarint(b[1:])
	if n <= 0 {
		return errCorruptCall
	}
	r.Group, r.Args = g, b[1+n:]
	return nil
}

// CallResponse is its answer: a result, or an error code and message
// (with the leader the answering node knows, for NotLeader).
type CallResponse struct {
	Result []byte
	Code   errCode
	Msg    string
	Leader uint64
}

// BrainMessage marks an internal message.
func (*CallResponse) BrainMessage() {}

// Marshal encodes the response.
func (r *CallResponse) Marshal() ([]byte, error) {
	b := []byte{byte(r.Code)}
	b = binary.AppendUvarint(b, r.Leader)
	b = binary.AppendUvarint(b, uint64(len(r.Msg)))
	b = append(b, r.Msg...)
	return append(b, r.Result...), nil
}

// Unmarshal decodes the response.
func (r *CallResponse) Unmarshal(b []byte) error {
	if err := r.unmarshalShared(b); err != nil {
		return err
	}
	r.Result = append([]byte(nil), r.Result...)
	return nil
}

// unmarshalShared decodes the response; its Result shares b.
func (r *CallResponse) unmarshalShared(b []byte) error {
	d := reader{b: b}
	code := d.byte()
	r.Leader = d.uvarint()
	r.Msg = string(d.chunk())
	if d.err != nil {
		return d.err
	}
	r.Code, r.Result = errCode(code), d.b
	return nil
}

var errCorruptCall = errors.New("kvapi: corrupt internal call")

// ErrNoReplica: the node does not host the group asked about.
var ErrNoReplica = errors.New("kvapi: no replica of the group here")

// NotLeaderError is a NotLeader answer with the leader the node knows (0
// if none).
type NotLeaderError struct{ Leader uint64 }

func (e *NotLeaderError) Error() string {
	return fmt.Sprintf("kvapi: not leader (leader %x)", e.Leader)
}

type errCode uint8

// Error codes, one per sentinel error callers match.
var errCodes = []error{
	nil,
	partition.ErrNotLeader, // 1: rewritten as NotLeaderError on the way back
	partition.ErrLeaderChanged,
	partition.ErrCompacted,
	partition.ErrFutureRev,
	partition.ErrKeyNotFound,
	partition.ErrLeaseNotFound,
	meta.ErrLeaseNotFound,
	meta.ErrLeaseExists,
	meta.ErrLeaseTTLTooLarge,
	ErrNoSpace,
	ErrNoReplica,
	context.DeadlineExceeded,
	context.Canceled,
	// Appended: existing codes keep their numbers across versions.
	ErrNoLeader,
	partition.ErrRetriesExhausted,
	partition.ErrOutsideRange,
	partition.ErrBadSplitKey,
}

const (
	codeNotLeader   errCode = 1
	codeCross       errCode = 200
	codeFateUnknown errCode = 201 // a re-sent call's fate is unknown (callsession.go)
	codeOther       errCode = 255
)

// errFateUnknown: the node cannot tell whether a re-sent call executed.
var errFateUnknown = errors.New("kvapi: the node does not know what became of the call")

func toCode(err error) (errCode, string) {
	var cross *CrossPartitionError
	if errors.As(err, &cross) {
		return codeCross, cross.Error()
	}
	// A meta command from a stale leader term was refused when it applied:
	// not executed, like one sent to a node that does not lead.
	for _, notLeader := range []error{partition.ErrNotLeader, raftgroup.ErrNotLeader, tso.ErrNotLeader, meta.ErrNotLeader, meta.ErrStaleTerm} {
		if errors.Is(err, notLeader) {
			return codeNotLeader, err.Error()
		}
	}
	if errors.Is(err, raftgroup.ErrLeaderChanged) {
		return 2, err.Error()
	}
	for i, e := range errCodes {
		if e != nil && errors.Is(err, e) {
			return errCode(i), err.Error()
		}
	}
	return codeOther, err.Error()
}

func fromCode(r *CallResponse) error {
	switch {
	case r.Code == 0:
		return nil
	case r.Code == codeNotLeader:
		return &NotLeaderError{Leader: r.Leader}
	case r.Code == codeCross:
		return &CrossPartitionError{message: r.Msg}
	case r.Code == codeFateUnknown:
		return &unavailableError{err: errFateUnknown}
	case int(r.Code) < len(errCodes):
		return errCodes[r.Code]
	}
	return errors.New(r.Msg)
}

const internalServiceName = "brain.Internal"

// Handler executes calls on this node's replicas.
type Handler interface {
	HandleCall(ctx context.Context, req *CallRequest) ([]byte, error)
	// LeaderOf returns the leader this node knows for group (0: none).
	LeaderOf(group uint64) uint64
	// ServeFeed serves a partition's Feed stream.
	ServeFeed(stream grpc.ServerStream) error
}

var internalServiceDesc = grpc.ServiceDesc{
	ServiceName: internalServiceName,
	HandlerType: (*Handler)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Call",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			var req CallRequest
			if err := dec(&req); err != nil {
				return nil, err
			}
			is := srv.(*internalServer)
			h := is.Handler
			is.begin(1)
			defer is.end(1)
			call := func(ctx context.Context, r any) (any, error) {
				req := r.(*CallRequest)
				res, err := h.HandleCall(ctx, req)
				return answer(h, req, res, err), nil
			}
			if interceptor == nil {
				return call(ctx, &req)
			}
			// The server's interceptors (the cluster check) apply.
			return interceptor(ctx, &req, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/" + internalServiceName + "/Call"}, call)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Feed",
		ServerStreams: true,
		Handler:       func(srv any, stream grpc.ServerStream) error { return srv.(*internalServer).Handler.ServeFeed(stream) },
	}, {
		StreamName:    "Calls",
		ServerStreams: true,
		ClientStreams: true,
		Handler:       func(srv any, stream grpc.ServerStream) error { return srv.(*internalServer).serveCalls(stream) },
	}},
	Metadata: "brain/internal",
}

// RegisterInternalService serves h on s. The function it returns drains
// the service before s stops: it waits, until ctx ends, for the calls under
// way to be answered (a forwarded write that has reached this node gets its
// outcome rather than a broken stream, which its caller could only answer
// with "leader changed").
func RegisterInternalService(s *grpc.Server, h Handler) (drain func(ctx context.Context) error) {
	is := newInternalServer(h)
	s.RegisterService(&internalServiceDesc, is)
	return is.drain
}

func newInternalServer(h Handler) *internalServer {
	return &internalServer{Handler: h, calls: workers.New(256, 10*time.Second), sessions: newCallSessions(), stopc: make(chan struct{})}
}

// internalServer is what one node serves its internal service with.
type internalServer struct {
	Handler
	// calls run the calls of every Calls stream the node serves, on
	// goroutines whose stacks stay grown from call to call.
	calls *workers.Pool
	// sessions: what the node remembers of its callers' broken streams.
	sessions *callSessions

	// stopping is set, and stopc closed, when the drain begins: Calls
	// streams execute nothing more and end once they answered what they
	// received.
	stopping atomic.Bool
	stopc    chan struct{}
	stopOnce sync.Once

	mu       sync.Mutex
	inflight int           // calls received and not yet answered, and open Calls streams; protected by mu
	idle     chan struct{} // closed when inflight is 0 after drain began; protected by mu
}

// begin counts n calls received.
func (is *internalServer) begin(n int) {
	is.mu.Lock()
	is.inflight += n
	is.mu.Unlock()
}

// end counts n calls answered (or given up with their stream).
func (is *internalServer) end(n int) {
	if n == 0 {
		return
	}
	is.mu.Lock()
	is.inflight -= n
	if is.inflight == 0 && is.idle != nil {
		close(is.idle)
		is.idle = nil
	}
	is.mu.Unlock()
}

// drain stops the service taking calls and waits until no call is under
// way and every Calls stream ended, or ctx ends (its error). A Calls
// stream ends cleanly once it sent the answers of the calls it received,
// so its caller knows that a call still unanswered was not executed.
func (is *internalServer) drain(ctx context.Context) error {
	is.stopOnce.Do(func() {
		is.stopping.Store(true)
		close(is.stopc)
	})
	is.mu.Lock()
	if is.inflight == 0 {
		is.mu.Unlock()
		return nil
	}
	if is.idle == nil {
		is.idle = make(chan struct{})
	}
	idle := is.idle
	is.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Client calls other nodes' internal service over the node's shared peer
// connections.
type Client struct {
	conns *peerconn.Pool
	unary bool // every call unary (tests, benchmarks)
	log   *slog.Logger
	// broken counts calls failed by a broken Calls stream, by whether they
	// had been sent (a write that had may have executed: its client is
	// answered "leader changed").
	broken *prometheus.CounterVec
	// resent counts calls re-sent after their stream broke, by outcome.
	resent *prometheus.CounterVec
	// session names this client's Calls streams; ids numbers their calls
	// (see callsession.go).
	session uint64
	ids     atomic.Uint64

	mu    sync.Mutex
	muxes map[uint64]*callMux         // Calls stream per node; protected by mu
	old   map[uint64]*grpc.ClientConn // a node's connection whose node serves no Calls; protected by mu
}

// NewClient returns a client that reaches nodes through conns (which its
// owner closes). log (nil: slog.Default()) gets a line for every Calls
// stream that breaks with calls under way.
func NewClient(conns *peerconn.Pool, log *slog.Logger) *Client {
	if log == nil {
		log = slog.Default()
	}
	c := &Client{conns: conns, log: log, session: randomID(), muxes: make(map[uint64]*callMux), old: make(map[uint64]*grpc.ClientConn)}
	c.broken = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "brain_internal_calls_broken_total",
		Help: "Calls to other nodes failed by a broken connection or stream, by whether they had been sent (sent writes may have executed: their clients get \"leader changed\").",
	}, []string{"sent"})
	c.broken.WithLabelValues("true")
	c.broken.WithLabelValues("false")
	c.resent = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "brain_internal_calls_resent_total",
		Help: "Calls re-sent to their node after the stream that carried them broke, by outcome: answered (executed there, or first), unknown (the node could not tell whether it executed: answered as a broken call), failed (no new stream to the node in time).",
	}, []string{"outcome"})
	for _, o := range []string{"answered", "unknown", "failed"} {
		c.resent.WithLabelValues(o)
	}
	return c
}

// Collectors returns the client's metrics.
func (c *Client) Collectors() []prometheus.Collector {
	return []prometheus.Collector{c.broken, c.resent}
}

// streamBroke logs a broken Calls stream to node and counts the calls it
// failed before they were sent (those sent are re-sent, and counted if
// that fails).
func (c *Client) streamBroke(node uint64, sent, unsent int, err error) {
	c.broken.WithLabelValues("false").Add(float64(unsent))
	c.log.Warn("the calls stream to a node broke with calls under way; the calls it had sent are sent again", "node", strconv.FormatUint(node, 16), "sent", sent, "unsent", unsent, "err", err)
}

func (c *Client) conn(node uint64) (*grpc.ClientConn, error) {
	conn, err := c.conns.Conn(node)
	if err != nil {
		return nil, fmt.Errorf("kvapi: %w", err)
	}
	return conn, nil
}

// Call executes req on node, on the Calls stream to it (unary for reads,
// see streamed, and if the node does not serve the stream).
func (c *Client) Call(ctx context.Context, node uint64, req *CallRequest) ([]byte, error) {
	conn, err := c.conn(node)
	if err != nil {
		return nil, err
	}
	if streamed(req.Op) {
		m, err := c.mux(node, conn)
		if err != nil {
			return nil, &unavailableError{node: node, err: err, notSent: neverSent(err)}
		}
		if m != nil {
			res, err := m.call(ctx, req)
			for attempt := 0; ; attempt++ {
				var lost *lostCall
				if !errors.As(err, &lost) {
					break
				}
				res, err = c.resend(ctx, lost, attempt)
			}
			var un *unavailableError
			if errors.As(err, &un) && !un.notSent && ctx.Err() == nil {
				c.broken.WithLabelValues("true").Inc()
			}
			if !errors.Is(err, errCallsUnsupported) {
				return res, err
			}
			c.mu.Lock()
			c.old[node] = conn
			c.mu.Unlock()
		}
	}
	var resp CallResponse
	if err := conn.Invoke(ctx, "/"+internalServiceName+"/Call", req, &resp); err != nil {
		un := &unavailableError{node: node, err: err, notSent: neverSent(err)}
		if ctx.Err() == nil && status.Code(err) == codes.Unavailable {
			c.broken.WithLabelValues(strconv.FormatBool(!un.notSent)).Inc()
		}
		return nil, un
	}
	return resp.Result, fromCode(&resp)
}

// maxResends bounds how many new streams a lost call is re-sent on.
const maxResends = 3

// resend re-sends a call its broken stream had carried on a new stream to
// its node (callsession.go); the call fails as sent (it may have executed)
// if the node restarted meanwhile, cannot be reached, or cannot tell.
func (c *Client) resend(ctx context.Context, lost *lostCall, attempt int) ([]byte, error) {
	fail := func(outcome string) ([]byte, error) {
		c.resent.WithLabelValues(outcome).Inc()
		return nil, &unavailableError{node: lost.node, err: lost.cause}
	}
	if attempt >= maxResends || ctx.Err() != nil {
		return fail("failed")
	}
	conn, err := c.conn(lost.node)
	if err != nil {
		return fail("failed")
	}
	m, err := c.mux(lost.node, conn)
	if err != nil || m == nil {
		return fail("failed")
	}
	select {
	case <-m.ready:
	case <-ctx.Done():
		return fail("failed")
	}
	m.mu.Lock()
	inc := m.incarnation
	m.mu.Unlock()
	if inc != lost.incarnation {
		return fail("unknown") // the node restarted: what it had is gone
	}
	res, err := m.resend(ctx, lost)
	var again *lostCall
	var un *unavailableError
	switch {
	case errors.As(err, &again):
	case errors.As(err, &un) && !un.notSent && errors.Is(err, lost.cause):
		c.resent.WithLabelValues("unknown").Inc()
	default:
		c.resent.WithLabelValues("answered").Inc()
	}
	return res, err
}

// mux returns the Calls stream to node over conn, opening one if there is
// none or it broke; nil if calls to node go unary.
func (c *Client) mux(node uint64, conn *grpc.ClientConn) (*callMux, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.unary || c.old[node] == conn {
		return nil, nil
	}
	if m := c.muxes[node]; m != nil && m.conn == conn && !m.broken() {
		return m, nil
	}
	m, err := openCallMux(node, conn, c.session, &c.ids, func(sent, unsent int, err error) { c.streamBroke(node, sent, unsent, err) })
	if err != nil {
		return nil, err
	}
	c.muxes[node] = m
	return m, nil
}

// neverSent reports whether a failed call's error shows it never reached
// the node: no connection could be made (refused, a failed TLS handshake),
// so gRPC failed it before sending. Such a call can be retried even when
// it writes; one that failed after it was sent may have executed.
func neverSent(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return false
	}
	msg := st.Message()
	return strings.Contains(msg, "Error while dialing") || strings.Contains(msg, "handshake failed")
}

// CallAddr executes req on the node at addr (a node not yet known by ID:
// a joining node asks a member about the cluster).
func CallAddr(ctx context.Context, addr string, req *CallRequest, opts ...grpc.DialOption) ([]byte, error) {
	conn, err := grpc.NewClient(addr, append(rpccodec.PeerDialOptions(), opts...)...)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var resp CallResponse
	if err := conn.Invoke(ctx, "/"+internalServiceName+"/Call", req, &resp); err != nil {
		return nil, err
	}
	return resp.Result, fromCode(&resp)
}

// unavailableError: the node could not be reached (it may be down).
type unavailableError struct {
	node    uint64
	err     error
	notSent bool // the call certainly did not reach the node (see neverSent)
}

func (e *unavailableError) Error() string { return fmt.Sprintf("kvapi: node %x: %v", e.node, e.err) }
func (e *unavailableError) Unwrap() error { return e.err }

// retryBackoff is the pause between attempts while a group has no known
// leader or it moved.
const retryBackoff = 20 * time.Millisecond

// encoding helpers

type reader struct {
	b   []byte
	err error
}

func (r *reader) byte() byte {
	if r.err != nil || len(r.b) < 1 {
		r.err = errCorruptCall
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errCorruptCall
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errCorruptCall
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) chunk() []byte {
	n := r.uvarint()
	if r.err != nil || uint64(len(r.b)) < n {
		r.err = errCorruptCall
		return nil
	}
	c := r.b[:n]
	r.b = r.b[n:]
	return c
}

func ints(vs ...int64) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.AppendVarint(b, v)
	}
	return b
}

func readInts(b []byte, n int) ([]int64, []byte, error) {
	r := reader{b: b}
	out := make([]int64, n)
	for i := range out {
		out[i] = r.varint()
	}
	return out, r.b, r.err
}
