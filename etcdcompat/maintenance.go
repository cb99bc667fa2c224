package etcdcompat

import (
	"context"
	"crypto/sha256"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type maintenanceServer struct {
	pb.UnimplementedMaintenanceServer
	s *Server
}

func (m *maintenanceServer) Alarm(ctx context.Context, r *pb.AlarmRequest) (*pb.AlarmResponse, error) {
	mt := m.s.cfg.Maintenance
	resp := &pb.AlarmResponse{Header: &pb.ResponseHeader{}}
	switch r.Action {
	case pb.AlarmRequest_GET:
		for _, a := range mt.Alarms() {
			if r.Alarm == pb.AlarmType_NONE || r.Alarm == a.Alarm {
				resp.Alarms = append(resp.Alarms, a)
			}
		}
	case pb.AlarmRequest_ACTIVATE, pb.AlarmRequest_DEACTIVATE:
		if r.Alarm == pb.AlarmType_NONE {
			break
		}
		activate := r.Action == pb.AlarmRequest_ACTIVATE
		if err := mt.SetAlarm(ctx, activate, r.MemberID, r.Alarm); err != nil {
			return nil, toGRPCError(err)
		}
		resp.Alarms = []*pb.AlarmMember{{MemberID: r.MemberID, Alarm: r.Alarm}}
	default:
		return nil, status.Error(codes.InvalidArgument, "etcdserver: unknown alarm action")
	}
	m.s.fill(resp.Header)
	return resp, nil
}

func (m *maintenanceServer) Status(ctx context.Context, r *pb.StatusRequest) (*pb.StatusResponse, error) {
	mt := m.s.cfg.Maintenance
	size, inUse := mt.DBSize()
	index, term, applied, leader := mt.RaftStatus()
	resp := &pb.StatusResponse{
		Header:           &pb.ResponseHeader{},
		Version:          Version,
		DbSize:           size,
		DbSizeInUse:      inUse,
		Leader:           leader,
		RaftIndex:        index,
		RaftTerm:         term,
		RaftAppliedIndex: applied,
		DbSizeQuota:      m.s.cfg.QuotaBackendBytes,
		StorageVersion:   Version,
	}
	for _, a := range mt.Alarms() {
		resp.Errors = append(resp.Errors, "memberID:"+formatID(a.MemberID)+" alarm:"+a.Alarm.String())
	}
	m.s.fill(resp.Header)
	return resp, nil
}

func formatID(id uint64) string {
	const digits = "0123456789abcdef"
	if id == 0 {
		return "0"
	}
	var b []byte
	for id > 0 {
		b = append([]byte{digits[id%16]}, b...)
		id /= 16
	}
	return string(b)
}

func (m *maintenanceServer) Defragment(ctx context.Context, r *pb.DefragmentRequest) (*pb.DefragmentResponse, error) {
	if err := m.s.cfg.Maintenance.Defragment(ctx); err != nil {
		return nil, toGRPCError(err)
	}
	resp := &pb.DefragmentResponse{Header: &pb.ResponseHeader{}}
	m.s.fill(resp.Header)
	return resp, nil
}

func (m *maintenanceServer) Hash(ctx context.Context, r *pb.HashRequest) (*pb.HashResponse, error) {
	h, _, _, err := m.s.cfg.Maintenance.HashKV(ctx, 0)
	if err != nil {
		return nil, toGRPCError(err)
	}
	resp := &pb.HashResponse{Header: &pb.ResponseHeader{}, Hash: h}
	m.s.fill(resp.Header)
	return resp, nil
}

func (m *maintenanceServer) HashKV(ctx context.Context, r *pb.HashKVRequest) (*pb.HashKVResponse, error) {
	h, rev, compact, err := m.s.cfg.Maintenance.HashKV(ctx, r.Revision)
	if err != nil {
		return nil, toGRPCError(err)
	}
	resp := &pb.HashKVResponse{Header: &pb.ResponseHeader{}, Hash: h, CompactRevision: compact, HashRevision: rev}
	m.s.fill(resp.Header)
	return resp, nil
}

// Snapshot streams a backup; like etcd it ends with the SHA-256 of
// everything sent before.
func (m *maintenanceServer) Snapshot(r *pb.SnapshotRequest, stream pb.Maintenance_SnapshotServer) error {
	h := sha256.New()
	first := true
	send := func(chunk []byte, remaining uint64) error {
		h.Write(chunk)
		resp := &pb.SnapshotResponse{Header: &pb.ResponseHeader{}, Blob: chunk, RemainingBytes: remaining}
		if first {
			resp.Version = Version
			first = false
		}
		m.s.fill(resp.Header)
		return stream.Send(resp)
	}
	if err := m.s.cfg.Maintenance.Snapshot(stream.Context(), send); err != nil {
		return toGRPCError(err)
	}
	resp := &pb.SnapshotResponse{Header: &pb.ResponseHeader{}, Blob: h.Sum(nil)}
	m.s.fill(resp.Header)
	return stream.Send(resp)
}

func (m *maintenanceServer) MoveLeader(ctx context.Context, r *pb.MoveLeaderRequest) (*pb.MoveLeaderResponse, error) {
	return nil, status.Error(codes.Unimplemented, "brain: MoveLeader is not supported: every partition, the TSO and the meta group have a leader of their own; use brainnode transfer-leader --group N --to NAME")
}

func (m *maintenanceServer) Downgrade(ctx context.Context, r *pb.DowngradeRequest) (*pb.DowngradeResponse, error) {
	return nil, status.Error(codes.Unimplemented, "brain: Downgrade is not supported")
}
