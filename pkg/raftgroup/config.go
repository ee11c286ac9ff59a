package raftgroup

import (
	"errors"
	"log/slog"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/credentials"
)

// Peer is a member of the group: its replica id and advertised gRPC address.
type Peer struct {
	ID   uint64
	Addr string
}

// Config configures one replica.
type Config struct {
	// GroupID names the Raft group. Every message carries it and replicas
	// refuse messages for another group, so a recycled address can never
	// deliver one group's traffic to another.
	GroupID uint64
	// ID is this replica's id within the group, >= 1, never reused.
	ID uint64
	// Addr is this replica's advertised gRPC address.
	Addr string
	// AnnotateStatus, if set, adds the service's own facts to the status
	// the Admin service reports (StatusProto), such as the addresses of the
	// process's other front ends, so that tools can find them. The engine
	// does not interpret them.
	AnnotateStatus func(*shardkvpb.MemberStatus)
	// Dir holds all of the replica's state.
	Dir string
	// Peers are the initial members, this replica included. They are used
	// only when Dir is empty and Join is false, to bootstrap a new group.
	Peers []Peer
	// Join starts an empty replica that waits to be added to an existing
	// group (as a learner, by the leader). Peers, if given, are only used as
	// addresses to reach.
	Join bool

	// TickInterval is Raft's logical clock tick. Default 100ms.
	TickInterval time.Duration
	// ElectionTicks (default 10) and HeartbeatTicks (default 1).
	ElectionTicks, HeartbeatTicks int
	// SnapshotEntries: take a snapshot marker and compact the log every so
	// many applied entries. Default 10000.
	SnapshotEntries uint64
	// TrailingEntries kept in the log after compaction, so a follower that is
	// slightly behind catches up from the log, not a snapshot. Default 5000.
	TrailingEntries uint64
	// SnapshotBytes: also take a marker and compact once the entries applied
	// since the last marker add up to this many bytes. Default 64 MiB.
	// TrailingBytes: keep fewer than TrailingEntries after a compaction if
	// they would add up to more than this. Default 16 MiB. Together they
	// bound the log by size, not only by count: a shard moving in as 256 KiB
	// chunks would otherwise keep up to 15000 of them (3.7 GiB) on disk.
	SnapshotBytes, TrailingBytes uint64
	// MaxCommandBytes bounds one proposed command, and so one log entry
	// (TiKV's raft-entry-max-size). Default DefaultMaxCommandBytes, at most
	// MaxCommandBytesLimit. The process's gRPC server must accept its
	// messages: create it with ServerOptionsFor(MaxCommandBytes). Every
	// replica of a group should have the same limit.
	MaxCommandBytes int

	// PeerCredentials secure the connections this replica dials to its
	// peers (mutual TLS: pkg/mtls); nil is plaintext. The server side is
	// the process's gRPC server, which the caller builds.
	PeerCredentials credentials.TransportCredentials

	// Now is this replica's wall clock (default time.Now): the time it
	// reports to its peers and, leading, the group's time it stamps log
	// entries with (docs/time.md). Raft's ticks and timeouts never read it:
	// they run on the monotonic clock. Tests inject a shifted or jumping
	// clock here (a process-wide fake such as faketime cannot reach Go,
	// which reads time through the vDSO).
	Now func() time.Time

	// Filter, if set, sees every outgoing message. Tests use it to drop,
	// delay, duplicate and reorder messages and to partition replicas.
	Filter Filter
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Filter decides the fate of one outgoing Raft message (fault injection).
type Filter interface {
	// Outgoing returns how many copies to deliver (0 drops it) and after
	// what delay.
	Outgoing(from, to uint64, m *pb.Message) (copies int, delay time.Duration)
}

func (c *Config) setDefaults() error {
	if c.ID == 0 {
		return errors.New("raftgroup: replica id must be >= 1")
	}
	if c.Dir == "" {
		return errors.New("raftgroup: data dir is required")
	}
	if c.TickInterval == 0 {
		c.TickInterval = 100 * time.Millisecond
	}
	if c.ElectionTicks == 0 {
		c.ElectionTicks = 10
	}
	if c.HeartbeatTicks == 0 {
		c.HeartbeatTicks = 1
	}
	if c.SnapshotEntries == 0 {
		c.SnapshotEntries = 10000
	}
	if c.TrailingEntries == 0 {
		c.TrailingEntries = 5000
	}
	if c.SnapshotBytes == 0 {
		c.SnapshotBytes = 64 << 20
	}
	if c.TrailingBytes == 0 {
		c.TrailingBytes = 16 << 20
	}
	if c.MaxCommandBytes == 0 {
		c.MaxCommandBytes = DefaultMaxCommandBytes
	}
	if err := checkCommandLimit(c.MaxCommandBytes); err != nil {
		return err
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}
