package server_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/server"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

var (
	diffSeed  = flag.Int64("diff.seed", 0, "seed of TestDifferentialAgainstEtcd (0: random)")
	diffSteps = flag.Int("diff.steps", 2500, "operations per differential run")
	diffTrace = flag.Bool("diff.trace", false, "log every request of TestDifferentialAgainstEtcd")
)

// The brain node under test splits at c, m and t; each partition gets its
// own keys, including keys with 0x00 and 0xFF bytes.
var (
	diffSplits = []string{"c", "m", "t"}
	diffKeys   = [][]string{
		{"\x00z", "a", "a\x00", "b/1", "b/2", "bb"},
		{"c", "d/1", "d/2", "d/3", "e", "l\xff"},
		{"m/1", "m/2", "n", "o", "p", "s"},
		{"t/1", "t/2", "u", "x", "z", "\xff\xfe"},
	}
	// Ranges within one partition, usable for deletes and txns: [key, end).
	diffLocalRanges = [][][2]string{
		{{"b/", "b0"}, {"a", "b/2"}, {"\x00", "c"}},
		{{"d/", "d0"}, {"c", "e"}, {"d/2", "m"}},
		{{"m/", "m0"}, {"n", "q"}, {"m", "t"}},
		{{"t/", "t0"}, {"t", "\xff"}, {"u", "\xff\xff"}},
	}
	// Ranges for reads may cross partitions; "\x00" as end means "to the end".
	diffReadRanges = [][2]string{
		{"a", "n"}, {"b", "u"}, {"\x00", "\x00"}, {"d/", "d0"}, {"m", "\x00"}, {"", ""}, {"zz", "a"},
	}
)

type differ struct {
	t      *testing.T
	rng    *rand.Rand
	brain  clients
	etcd   clients
	step   int
	leases []int64 // granted lease IDs (both sides use the same IDs)
	// leaseHome is the partition a lease's keys live in, so that revoking
	// it deletes keys in one partition and costs one revision, as in etcd.
	leaseHome map[int64]int
	compacted int64
	watchRevs []int64
}

type clients struct {
	name  string
	kv    pb.KVClient
	lease pb.LeaseClient
	watch pb.WatchClient
	mt    pb.MaintenanceClient
	cli   *clientv3.Client
}

func newClients(t *testing.T, name, endpoint string) clients {
	conn := testutil.Dial(t, endpoint)
	return clients{name: name, kv: pb.NewKVClient(conn), lease: pb.NewLeaseClient(conn), watch: pb.NewWatchClient(conn),
		mt: pb.NewMaintenanceClient(conn), cli: testutil.Client(t, endpoint)}
}

// TestDifferentialAgainstEtcd runs the same random single-client sequence
// of requests against brain and a real etcd 3.6 and requires identical
// responses: values, revisions, versions, counts, More, and errors (code and
// message). The generator keeps writing txns and deletes within one
// partition and a lease's keys within one partition, where brain promises
// etcd's exact revisions (read-only txns go anywhere); cross-partition
// writes have tests of their own.
func TestDifferentialAgainstEtcd(t *testing.T) {
	seed := *diffSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("seed %d (rerun: go test ./server -run TestDifferentialAgainstEtcd -diff.seed=%d)", seed, seed)
	b := testutil.StartBrain(t, server.Config{InitialSplitPoints: diffSplits})
	e := testutil.StartEtcd(t)
	d := &differ{t: t, rng: rand.New(rand.NewSource(seed)), leaseHome: map[int64]int{},
		brain: newClients(t, "brain", testutil.Endpoint(b)), etcd: newClients(t, "etcd", e)}
	for d.step = 0; d.step < *diffSteps; d.step++ {
		d.randomOp()
		if t.Failed() {
			t.Fatalf("stopped at step %d (seed %d)", d.step, seed)
		}
	}
	d.compareWatches()
}

func (d *differ) pick(n int) int { return d.rng.Intn(n) }

func (d *differ) key() []byte {
	p := diffKeys[d.pick(len(diffKeys))]
	return []byte(p[d.pick(len(p))])
}

func (d *differ) keyIn(part int) []byte {
	return []byte(diffKeys[part][d.pick(len(diffKeys[part]))])
}

func (d *differ) value() []byte {
	v := make([]byte, d.pick(12))
	d.rng.Read(v)
	return v
}

func (d *differ) revision(cur int64) int64 {
	switch d.pick(6) {
	case 0:
		return 0
	case 1:
		return cur + 1 + int64(d.pick(3)) // future
	case 2:
		if d.compacted > 1 {
			return int64(d.pick(int(d.compacted))) // compacted (or 0)
		}
		return 0
	default:
		if cur <= 1 {
			return 0
		}
		return 1 + int64(d.pick(int(cur)))
	}
}

func (d *differ) current() int64 {
	r, err := d.etcd.kv.Range(context.Background(), &pb.RangeRequest{Key: []byte("x"), Limit: 1, Serializable: false})
	if err != nil {
		d.t.Fatal(err)
	}
	return r.Header.Revision
}

func (d *differ) randomOp() {
	switch w := d.pick(100); {
	case w < 28:
		d.put()
	case w < 50:
		d.rangeOp()
	case w < 58:
		d.deleteOp()
	case w < 80:
		d.txn()
	case w < 82:
		d.compact()
	case w < 90:
		d.leaseOp()
	case w < 93:
		d.badRequest()
	case w < 95:
		d.watchRevs = append(d.watchRevs, d.revision(d.current()))
	default:
		d.putWithLease()
	}
}

func (d *differ) randomPut(part int) *pb.PutRequest {
	r := &pb.PutRequest{Key: d.keyIn(part), Value: d.value(), PrevKv: d.pick(2) == 0}
	switch d.pick(8) {
	case 0:
		r.IgnoreValue, r.Value = true, nil
	case 1:
		r.IgnoreLease = true
	}
	return r
}

func (d *differ) put() {
	r := d.randomPut(d.pick(len(diffKeys)))
	call(d, "Put", r, func(c clients) (resp, error) { return c.kv.Put(context.Background(), r) })
}

func (d *differ) putWithLease() {
	if len(d.leases) == 0 {
		d.leaseOp()
		return
	}
	id := d.leases[d.pick(len(d.leases))]
	r := &pb.PutRequest{Key: d.keyIn(d.leaseHome[id]), Value: d.value(), Lease: id, PrevKv: true}
	call(d, "Put(lease)", r, func(c clients) (resp, error) { return c.kv.Put(context.Background(), r) })
}

func (d *differ) rangeReq(cur int64) *pb.RangeRequest {
	r := &pb.RangeRequest{}
	switch d.pick(3) {
	case 0:
		r.Key = d.key()
	default:
		rg := diffReadRanges[d.pick(len(diffReadRanges))]
		r.Key, r.RangeEnd = []byte(rg[0]), []byte(rg[1])
		if len(r.Key) == 0 {
			r.Key = []byte{0}
			r.RangeEnd = []byte{0}
		}
	}
	if d.pick(2) == 0 {
		r.Limit = int64(d.pick(5))
	}
	if d.pick(3) == 0 {
		r.Revision = d.revision(cur)
	}
	if d.pick(4) == 0 {
		r.SortOrder = pb.RangeRequest_SortOrder(d.pick(3))
		r.SortTarget = pb.RangeRequest_SortTarget(d.pick(5))
	}
	r.Serializable = d.pick(8) == 0 && r.Revision != 0
	r.KeysOnly = d.pick(5) == 0
	r.CountOnly = d.pick(8) == 0
	if d.pick(6) == 0 {
		r.MinModRevision = int64(d.pick(int(cur) + 1))
	}
	if d.pick(6) == 0 {
		r.MaxModRevision = int64(d.pick(int(cur) + 1))
	}
	if d.pick(8) == 0 {
		r.MinCreateRevision = int64(d.pick(int(cur) + 1))
	}
	if d.pick(8) == 0 {
		r.MaxCreateRevision = int64(d.pick(int(cur) + 1))
	}
	return r
}

func (d *differ) rangeOp() {
	r := d.rangeReq(d.current())
	call(d, "Range", r, func(c clients) (resp, error) { return c.kv.Range(context.Background(), r) })
}

func (d *differ) localDelete(part int) *pb.DeleteRangeRequest {
	r := &pb.DeleteRangeRequest{PrevKv: d.pick(2) == 0}
	if d.pick(2) == 0 {
		r.Key = d.keyIn(part)
	} else {
		rg := diffLocalRanges[part][d.pick(len(diffLocalRanges[part]))]
		r.Key, r.RangeEnd = []byte(rg[0]), []byte(rg[1])
	}
	return r
}

func (d *differ) deleteOp() {
	r := d.localDelete(d.pick(len(diffKeys)))
	call(d, "DeleteRange", r, func(c clients) (resp, error) { return c.kv.DeleteRange(context.Background(), r) })
}

func (d *differ) compare(part int, cur int64) *pb.Compare {
	c := &pb.Compare{Key: d.keyIn(part), Result: pb.Compare_CompareResult(d.pick(4)), Target: pb.Compare_CompareTarget(d.pick(5))}
	if d.pick(6) == 0 {
		rg := diffLocalRanges[part][d.pick(len(diffLocalRanges[part]))]
		c.Key, c.RangeEnd = []byte(rg[0]), []byte(rg[1])
	}
	n := int64(d.pick(int(cur) + 2))
	switch c.Target {
	case pb.Compare_VERSION:
		c.TargetUnion = &pb.Compare_Version{Version: int64(d.pick(4))}
	case pb.Compare_CREATE:
		c.TargetUnion = &pb.Compare_CreateRevision{CreateRevision: n}
	case pb.Compare_MOD:
		c.TargetUnion = &pb.Compare_ModRevision{ModRevision: n}
	case pb.Compare_VALUE:
		c.TargetUnion = &pb.Compare_Value{Value: d.value()}
	case pb.Compare_LEASE:
		var l int64
		if len(d.leases) > 0 && d.pick(2) == 0 {
			l = d.leases[d.pick(len(d.leases))]
		}
		c.TargetUnion = &pb.Compare_Lease{Lease: l}
	}
	return c
}

func (d *differ) ops(part int, cur int64, depth int) []*pb.RequestOp {
	var out []*pb.RequestOp
	used := map[string]bool{}
	for i, n := 0, d.pick(4); i < n; i++ {
		switch k := d.pick(10); {
		case k < 3:
			r := d.rangeReq(cur)
			r.Key, r.RangeEnd = d.keyIn(part), nil
			if d.pick(3) == 0 {
				rg := diffLocalRanges[part][d.pick(len(diffLocalRanges[part]))]
				r.Key, r.RangeEnd = []byte(rg[0]), []byte(rg[1])
			}
			r.Serializable = false
			out = append(out, &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: r}})
		case k < 7:
			r := d.randomPut(part)
			if used[string(r.Key)] && d.pick(4) != 0 {
				continue // mostly valid txns; sometimes a duplicate
			}
			used[string(r.Key)] = true
			out = append(out, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: r}})
		case k < 9:
			r := &pb.DeleteRangeRequest{Key: d.keyIn(part), PrevKv: d.pick(2) == 0}
			if used[string(r.Key)] && d.pick(4) != 0 {
				continue
			}
			used[string(r.Key)] = true
			out = append(out, &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: r}})
		default:
			if depth < 2 {
				out = append(out, &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: d.txnReq(part, cur, depth+1)}})
			}
		}
	}
	return out
}

func (d *differ) txnReq(part int, cur int64, depth int) *pb.TxnRequest {
	r := &pb.TxnRequest{}
	for i, n := 0, d.pick(3); i < n; i++ {
		r.Compare = append(r.Compare, d.compare(part, cur))
	}
	r.Success = d.ops(part, cur, depth)
	r.Failure = d.ops(part, cur, depth)
	return r
}

func (d *differ) txn() {
	cur := d.current()
	part := d.pick(len(diffKeys))
	var r *pb.TxnRequest
	switch d.pick(5) {
	case 0: // kube-apiserver's create
		k := d.keyIn(part)
		r = &pb.TxnRequest{
			Compare: []*pb.Compare{{Key: k, Target: pb.Compare_MOD, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_ModRevision{ModRevision: 0}}},
			Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: k, Value: d.value()}}}},
		}
	case 1: // kube-apiserver's update / delete with a read on failure
		k := d.keyIn(part)
		mod := d.revision(cur)
		var op *pb.RequestOp
		if d.pick(2) == 0 {
			op = &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: k, Value: d.value()}}}
		} else {
			op = &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: k}}}
		}
		r = &pb.TxnRequest{
			Compare: []*pb.Compare{{Key: k, Target: pb.Compare_MOD, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_ModRevision{ModRevision: mod}}},
			Success: []*pb.RequestOp{op},
			Failure: []*pb.RequestOp{{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: k}}}},
		}
	case 2: // read-only, over any partitions: compares and ranges anywhere
		r = &pb.TxnRequest{}
		for i, n := 0, d.pick(4); i < n; i++ {
			c := d.compare(d.pick(len(diffKeys)), cur)
			if d.pick(5) == 0 {
				rg := diffReadRanges[d.pick(len(diffReadRanges))]
				c.Key, c.RangeEnd = []byte(rg[0]), []byte(rg[1])
				if len(c.Key) == 0 {
					c.Key, c.RangeEnd = []byte{0}, []byte{0}
				}
			}
			r.Compare = append(r.Compare, c)
		}
		for _, ops := range []*[]*pb.RequestOp{&r.Success, &r.Failure} {
			for i, n := 0, d.pick(4); i < n; i++ {
				rr := d.rangeReq(cur)
				rr.Serializable = false
				*ops = append(*ops, &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: rr}})
			}
		}
	default:
		r = d.txnReq(part, cur, 0)
	}
	call(d, "Txn", r, func(c clients) (resp, error) { return c.kv.Txn(context.Background(), r) })
}

func (d *differ) compact() {
	cur := d.current()
	lo := max(d.compacted-1, 0)
	rev := lo + int64(d.pick(int(cur-lo)+2))
	r := &pb.CompactionRequest{Revision: rev, Physical: d.pick(2) == 0}
	if call(d, "Compact", r, func(c clients) (resp, error) { return c.kv.Compact(context.Background(), r) }) == nil {
		d.compacted = max(d.compacted, rev)
	}
}

func (d *differ) leaseOp() {
	switch d.pick(6) {
	case 0, 1:
		id := int64(d.pick(1000) + 1)
		r := &pb.LeaseGrantRequest{ID: id, TTL: int64(d.pick(3)*1000 + 999)}
		short := d.pick(8) == 0
		if short {
			// Raised to the minimum TTL (2s); revoked at once so that its
			// expiry, timed differently on the two servers, never happens.
			r.TTL = int64(d.pick(3) - 1)
		}
		if d.pick(10) == 0 {
			r.TTL = 9000000001 // too large
		}
		if call(d, "LeaseGrant", r, func(c clients) (resp, error) { return c.lease.LeaseGrant(context.Background(), r) }) == nil {
			if short {
				rr := &pb.LeaseRevokeRequest{ID: id}
				call(d, "LeaseRevoke", rr, func(c clients) (resp, error) { return c.lease.LeaseRevoke(context.Background(), rr) })
				return
			}
			d.leases = append(d.leases, id)
			d.leaseHome[id] = d.pick(len(diffKeys))
		}
	case 2:
		id := int64(d.pick(1000) + 1)
		if len(d.leases) > 0 && d.pick(4) != 0 {
			id = d.leases[d.pick(len(d.leases))]
		}
		r := &pb.LeaseRevokeRequest{ID: id}
		if call(d, "LeaseRevoke", r, func(c clients) (resp, error) { return c.lease.LeaseRevoke(context.Background(), r) }) == nil {
			for i, l := range d.leases {
				if l == id {
					d.leases = append(d.leases[:i], d.leases[i+1:]...)
					break
				}
			}
		}
	case 3, 4:
		id := int64(d.pick(1000) + 1)
		if len(d.leases) > 0 && d.pick(4) != 0 {
			id = d.leases[d.pick(len(d.leases))]
		}
		r := &pb.LeaseTimeToLiveRequest{ID: id, Keys: d.pick(2) == 0}
		brainTTL := int64(-1)
		call(d, "LeaseTimeToLive", r, func(c clients) (resp, error) {
			out, err := c.lease.LeaseTimeToLive(context.Background(), r)
			if out != nil && out.TTL > 0 {
				// Remaining TTLs differ by the time between the grants
				// and between the calls (brain is asked first): within
				// two seconds counts as the same. (Rounding both to tens
				// failed whenever the two fell either side of a boundary.)
				if c.name == "brain" {
					brainTTL = out.TTL
				} else if brainTTL > 0 && out.TTL-brainTTL >= -2 && out.TTL-brainTTL <= 2 {
					out.TTL = brainTTL
				}
			}
			return out, err
		})
	case 5:
		r := &pb.LeaseLeasesRequest{}
		call(d, "LeaseLeases", r, func(c clients) (resp, error) { return c.lease.LeaseLeases(context.Background(), r) })
	}
}

func (d *differ) badRequest() {
	var name string
	var r resp
	var f func(c clients) (resp, error)
	switch d.pick(9) {
	case 0:
		req := &pb.PutRequest{Key: nil, Value: []byte("v")}
		name, r, f = "Put(empty key)", req, func(c clients) (resp, error) { return c.kv.Put(context.Background(), req) }
	case 1:
		req := &pb.PutRequest{Key: []byte("a"), Value: []byte("v"), IgnoreValue: true}
		name, r, f = "Put(ignore_value+value)", req, func(c clients) (resp, error) { return c.kv.Put(context.Background(), req) }
	case 2:
		req := &pb.TxnRequest{}
		for i := 0; i < 129; i++ {
			req.Success = append(req.Success, &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("a")}}})
		}
		name, r, f = "Txn(129 ops)", req, func(c clients) (resp, error) { return c.kv.Txn(context.Background(), req) }
	case 3:
		put := &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("a"), Value: []byte("1")}}}
		req := &pb.TxnRequest{Success: []*pb.RequestOp{put, put}}
		name, r, f = "Txn(duplicate)", req, func(c clients) (resp, error) { return c.kv.Txn(context.Background(), req) }
	case 4:
		req := &pb.PutRequest{Key: []byte("a"), Value: bytes.Repeat([]byte{'x'}, 1600*1024)}
		name, r, f = "Put(1.6MiB)", req, func(c clients) (resp, error) { return c.kv.Put(context.Background(), req) }
	case 5:
		req := &pb.PutRequest{Key: []byte("a"), Value: bytes.Repeat([]byte{'x'}, 3<<20)}
		name, r, f = "Put(3MiB)", req, func(c clients) (resp, error) { return c.kv.Put(context.Background(), req) }
	case 6:
		req := &pb.PutRequest{Key: []byte("a"), Value: []byte("v"), Lease: 123456789}
		name, r, f = "Put(unknown lease)", req, func(c clients) (resp, error) { return c.kv.Put(context.Background(), req) }
	case 7:
		req := &pb.RangeRequest{Key: nil}
		name, r, f = "Range(empty key)", req, func(c clients) (resp, error) { return c.kv.Range(context.Background(), req) }
	case 8:
		req := &pb.RangeRequest{Key: []byte("a"), SortOrder: 9}
		name, r, f = "Range(bad sort)", req, func(c clients) (resp, error) { return c.kv.Range(context.Background(), req) }
	}
	call(d, name, r, f)
}

type resp interface {
	Marshal() ([]byte, error)
	String() string
}

// call sends a request to both and compares the normalized responses. It
// returns the (shared) error, if any.
func call(d *differ, name string, req resp, f func(c clients) (resp, error)) error {
	d.t.Helper()
	if *diffTrace {
		d.t.Logf("step %d %s %s", d.step, name, short(req))
	}
	br, berr := f(d.brain)
	er, eerr := f(d.etcd)
	bs, es := status.Convert(berr), status.Convert(eerr)
	if (berr == nil) != (eerr == nil) || berr != nil && (bs.Code() != es.Code() || bs.Message() != es.Message()) {
		d.t.Errorf("step %d %s %s:\n brain error: %v\n  etcd error: %v", d.step, name, short(req), berr, eerr)
		return berr
	}
	if berr != nil {
		return berr
	}
	normalize(br)
	normalize(er)
	bb, _ := br.Marshal()
	eb, _ := er.Marshal()
	if !bytes.Equal(bb, eb) {
		d.t.Errorf("step %d %s %s:\n brain: %s\n  etcd: %s", d.step, name, short(req), br, er)
	}
	return nil
}

func short(r resp) string {
	s := r.String()
	if len(s) > 600 {
		s = s[:600] + "..."
	}
	return s
}

// normalize clears what legitimately differs between two servers: cluster
// and member IDs and raft terms.
func normalize(r any) {
	type headered interface{ GetHeader() *pb.ResponseHeader }
	if h, ok := r.(headered); ok && h.GetHeader() != nil {
		hd := h.GetHeader()
		hd.ClusterId, hd.MemberId, hd.RaftTerm = 0, 0, 0
	}
	if l, ok := r.(*pb.LeaseTimeToLiveResponse); ok {
		// etcd lists a lease's keys in map order.
		sort.Slice(l.Keys, func(i, j int) bool { return bytes.Compare(l.Keys[i], l.Keys[j]) < 0 })
	}
	if l, ok := r.(*pb.LeaseLeasesResponse); ok {
		sort.Slice(l.Leases, func(i, j int) bool { return l.Leases[i].ID < l.Leases[j].ID })
	}
	if t, ok := r.(*pb.TxnResponse); ok {
		for _, op := range t.Responses {
			switch v := op.Response.(type) {
			case *pb.ResponseOp_ResponseTxn:
				normalize(v.ResponseTxn)
			case *pb.ResponseOp_ResponseRange:
				normalize(v.ResponseRange)
			case *pb.ResponseOp_ResponsePut:
				normalize(v.ResponsePut)
			case *pb.ResponseOp_ResponseDeleteRange:
				normalize(v.ResponseDeleteRange)
			}
		}
	}
}

// compareWatches opens, on both servers, watches from the revisions noted
// during the run (and a few more), over several ranges and options, writes
// revisions up to the highest start revision among them (so every watch
// sees something and RequestProgress is answered), and
// requires the same event history up to it.
func (d *differ) compareWatches() {
	cur := d.current()
	revs := append(d.watchRevs, 1, cur, cur+1, max(d.compacted, 1), d.compacted-1)
	// Write up to the highest start revision among the watches (at least
	// one revision): etcd, and brain with it, ignore RequestProgress while
	// a watch on the stream waits for a future revision, so a watch whose
	// range sees no write could not otherwise be shown to reach the end.
	upTo := slices.Max(revs)
	ranges := [][2]string{{"\x00", "\x00"}, {"b/", "b0"}, {"c", "t"}, {"a", ""}}
	type pair struct {
		desc        string
		brain, etcd *openWatch
	}
	var ws []pair
	for i, rev := range revs {
		if rev < 0 {
			continue
		}
		rg := ranges[i%len(ranges)]
		opts := []clientv3.OpOption{clientv3.WithRev(rev), clientv3.WithProgressNotify()}
		if rg[1] != "" {
			opts = append(opts, clientv3.WithRange(rg[1]))
		}
		if i%2 == 0 {
			opts = append(opts, clientv3.WithPrevKV())
		}
		if i%5 == 3 {
			opts = append(opts, clientv3.WithFilterPut())
		}
		ws = append(ws, pair{
			desc:  fmt.Sprintf("watch from %d on [%q, %q) (compacted at %d, current %d, written up to %d)", rev, rg[0], rg[1], d.compacted, cur, upTo),
			brain: startWatch(d.brain.cli, rg[0], opts),
			etcd:  startWatch(d.etcd.cli, rg[0], opts),
		})
	}
	for i := cur + 1; i <= upTo; i++ {
		last := &pb.PutRequest{Key: []byte("b/1"), Value: []byte(fmt.Sprintf("last %d", i))}
		call(d, "Put", last, func(c clients) (resp, error) { return c.kv.Put(context.Background(), last) })
	}
	for _, w := range ws {
		bh := w.brain.collect(d.t, upTo)
		eh := w.etcd.collect(d.t, upTo)
		if bh != eh {
			d.t.Errorf("%s:\nbrain:\n%s\netcd:\n%s", w.desc, bh, eh)
		}
	}
}

type openWatch struct {
	c      *clientv3.Client
	key    string
	ctx    context.Context
	cancel context.CancelFunc
	wch    clientv3.WatchChan
}

func startWatch(c *clientv3.Client, key string, opts []clientv3.OpOption) *openWatch {
	// No deadline here: collect gives each watch its own time, counted
	// from when it starts waiting on it, so one watch that never reaches
	// its revision does not make every later one time out too.
	ctx, cancel := context.WithCancel(context.Background())
	// RequestProgress finds the watch stream by the context given to Watch.
	ctx = clientv3.WithRequireLeader(ctx)
	return &openWatch{c: c, key: key, ctx: ctx, cancel: cancel, wch: c.Watch(ctx, key, opts...)}
}

// collect returns the watch's history up to revision upTo as text.
func (w *openWatch) collect(t *testing.T, upTo int64) string {
	defer w.cancel()
	var out strings.Builder
	ticker := time.NewTicker(50 * time.Millisecond)
	defer ticker.Stop()
	timeout := time.NewTimer(20 * time.Second)
	defer timeout.Stop()
	for {
		select {
		case wr, ok := <-w.wch:
			if !ok {
				return out.String() + "closed\n"
			}
			if wr.CompactRevision != 0 {
				fmt.Fprintf(&out, "compacted at %d, canceled=%v\n", wr.CompactRevision, wr.Canceled)
				return out.String()
			}
			if err := wr.Err(); err != nil {
				fmt.Fprintf(&out, "error %v\n", err)
				return out.String()
			}
			for _, ev := range wr.Events {
				fmt.Fprintf(&out, "%s\n", fmtEvent(ev))
			}
			if wr.IsProgressNotify() && wr.Header.Revision >= upTo {
				return out.String()
			}
			if n := len(wr.Events); n > 0 && wr.Events[n-1].Kv.ModRevision >= upTo {
				return out.String()
			}
		case <-ticker.C:
			_ = w.c.RequestProgress(w.ctx)
		case <-timeout.C:
			t.Errorf("watch on %q did not reach revision %d", w.key, upTo)
			return out.String() + "timeout\n"
		}
	}
}

func fmtEvent(ev *clientv3.Event) string {
	kv := func(k *mvccpb.KeyValue) string {
		if k == nil {
			return "nil"
		}
		return fmt.Sprintf("%q=%q c%d m%d v%d l%d", k.Key, k.Value, k.CreateRevision, k.ModRevision, k.Version, k.Lease)
	}
	return fmt.Sprintf("%s %s prev=%s", ev.Type, kv(ev.Kv), kv(ev.PrevKv))
}

var _ = grpc.WithBlock
