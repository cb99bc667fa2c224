package raftgroup

import (
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3/raftpb"
)

type metrics struct {
	proposals         prometheus.Counter
	proposalsDropped  prometheus.Counter
	deposedProposals  *prometheus.CounterVec
	leadersLost       prometheus.Counter
	applied           prometheus.Counter
	roundGroups       prometheus.Histogram
	logSync           prometheus.Histogram
	snapshotsSent     prometheus.Counter
	snapshotsJoined   prometheus.Counter
	snapshotsReceived prometheus.Counter
	batchesReceived   prometheus.Counter
	batchesSent       *prometheus.CounterVec
	messagesSent      *prometheus.CounterVec
	batchTransit      prometheus.Histogram
	sendQueue         prometheus.Histogram
	inboxWait         prometheus.Histogram
	tickDelay         prometheus.Histogram
	messagesReceived  *prometheus.CounterVec
	receivedByType    map[raftpb.MessageType]prometheus.Counter // messagesReceived's children of the types peers send (read-only)
	heartbeatsSkipped prometheus.Counter
	leadership        map[bool]prometheus.Counter // brain_raft_leadership_changes_total's children: gained (true), lost (false)
	leader            *prometheus.GaugeVec
	term              *prometheus.GaugeVec
	appliedIndex      *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		proposals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "brain_raft_proposals_total", Help: "Raft proposals handed to leaders.",
		}),
		proposalsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "brain_raft_proposals_dropped_total", Help: "Raft proposals dropped (not leader).",
		}),
		deposedProposals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "brain_raft_deposed_proposals_total",
			Help: "Proposals a deposed leader waited on past its leadership (ProposeAsyncFate), by fate: applied (a later leader committed it), dropped (it never will apply) or unknown (no answer in time, or a snapshot hid it).",
		}, []string{"fate"}),
		leadersLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "brain_raft_leaders_lost_total",
			Help: "Groups whose replica here forgot its leader because the leader's node connection broke (its process died), and advanced its election (Host.PeerLost).",
		}),
		applied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "brain_raft_applied_entries_total", Help: "Committed raft entries applied.",
		}),
		roundGroups: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "brain_raft_round_groups", Help: "Groups with a Ready processed in one worker round (one sync).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64},
		}),
		logSync: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "brain_raft_log_sync_seconds", Help: "Latency of one synced raft log batch commit.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14),
		}),
		snapshotsSent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "brain_raft_snapshots_sent_total", Help: "Raft snapshots sent to lagging or new replicas.",
		}),
		snapshotsReceived: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "brain_raft_snapshots_received_total", Help: "Raft snapshots received.",
		}),
		snapshotsJoined: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "brain_raft_snapshots_joined_total", Help: "Raft snapshots not sent because one to the same replica was already on its way (its outcome answers both).",
		}),
		batchesReceived: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "brain_raft_batches_received_total", Help: "Batches of raft messages received from other nodes (one per sender's send).",
		}),
		batchesSent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "brain_raft_batches_sent_total", Help: "Batches of raft messages sent to other nodes (one per send), by destination member ID.",
		}, []string{"to"}),
		messagesSent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "brain_raft_messages_sent_total", Help: "Raft messages sent to other nodes, by destination member ID.",
		}, []string{"to"}),
		batchTransit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "brain_raft_batch_transit_seconds",
			Help:    "Time from a raft batch's oldest message being queued for this node on its sender to the batch being read here (sender's queue, gRPC and network, by the two nodes' wall clocks; 0 when the receiver's is behind).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 17),
		}),
		sendQueue: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "brain_raft_send_queue_seconds",
			Help:    "Time from a raft batch's oldest message being queued for another node to this node's sender taking the batch to send it (the sender's part of the other node's brain_raft_batch_transit_seconds).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 17),
		}),
		inboxWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "brain_raft_inbox_wait_seconds",
			Help:    "Time inbound raft messages wait in a group's inbox, from the first one delivered to the group's worker stepping them.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 17),
		}),
		tickDelay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "brain_raft_tick_delay_seconds",
			Help:    "Time from the raft ticker firing to its tick reaching the groups, after the goroutines already runnable (as input from the network waits for them): how far the raft clock slows on a busy node.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 17),
		}),
		messagesReceived: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "brain_raft_messages_received_total", Help: "Raft messages received from other nodes, by type (MsgApp, MsgHeartbeat, ...).",
		}, []string{"type"}),
		heartbeatsSkipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "brain_raft_heartbeats_skipped_total", Help: "Raft heartbeats not sent because the follower got an append since the last one.",
		}),
		leader: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "brain_raft_is_leader", Help: "1 if this node leads the raft group (and is ready to serve), else 0.",
		}, []string{"group"}),
		term: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "brain_raft_term", Help: "The raft group's current term on this node.",
		}, []string{"group"}),
		appliedIndex: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "brain_raft_applied_index", Help: "The raft group's applied index on this node.",
		}, []string{"group"}),
	}
	leadership := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "brain_raft_leadership_changes_total",
		Help: "Leaderships of raft groups this node gained or lost (elections and transfers; as etcd_server_leader_changes_seen_total, but counted by the node that led).",
	}, []string{"change"})
	m.leadership = map[bool]prometheus.Counter{true: leadership.WithLabelValues("gained"), false: leadership.WithLabelValues("lost")}
	m.receivedByType = make(map[raftpb.MessageType]prometheus.Counter, len(peerMessageTypes))
	for _, t := range peerMessageTypes {
		m.receivedByType[t] = m.messagesReceived.WithLabelValues(t.String())
	}
	for _, fate := range []string{"applied", "dropped", "unknown"} {
		m.deposedProposals.WithLabelValues(fate)
	}
	if reg != nil {
		reg.MustRegister(m.proposals, m.proposalsDropped, m.deposedProposals, m.leadersLost, m.applied, m.roundGroups, m.logSync, m.snapshotsSent, m.snapshotsReceived, m.snapshotsJoined, m.batchesReceived, m.batchesSent, m.messagesSent, m.batchTransit, m.sendQueue, m.inboxWait, m.tickDelay, m.messagesReceived, m.heartbeatsSkipped, leadership, m.leader, m.term, m.appliedIndex)
	}
	return m
}

// peerMessageTypes are the raft messages nodes send each other.
var peerMessageTypes = []raftpb.MessageType{
	raftpb.MsgApp, raftpb.MsgAppResp, raftpb.MsgHeartbeat, raftpb.MsgHeartbeatResp,
	raftpb.MsgVote, raftpb.MsgVoteResp, raftpb.MsgPreVote, raftpb.MsgPreVoteResp,
	raftpb.MsgTimeoutNow, raftpb.MsgSnap,
}

// received returns the counter of received messages of type t.
func (m *metrics) received(t raftpb.MessageType) prometheus.Counter {
	if c, ok := m.receivedByType[t]; ok {
		return c
	}
	return m.messagesReceived.WithLabelValues(t.String())
}
