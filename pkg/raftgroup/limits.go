package raftgroup

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/shardkv/shardkv/pkg/grpcdial"
)

// Size limits of one replica. One proposed command is one Raft entry, which
// travels whole in one gRPC message between replicas (raft never splits an
// entry), so the transport's message limit follows from the entry limit.
const (
	// DefaultMaxCommandBytes is the default Config.MaxCommandBytes, as
	// TiKV's raft-entry-max-size: large enough for a write carrying two
	// 8 MiB values (CAS: the expected and the new one) with its key.
	DefaultMaxCommandBytes = 24 << 20
	// MaxCommandBytesLimit is the largest Config.MaxCommandBytes accepted.
	MaxCommandBytesLimit = 96 << 20
	// messageOverhead covers a batch's framing around its messages and a
	// message's framing around its entries.
	messageOverhead = 1 << 20
)

// MessageBytesFor is the gRPC message limit that carries commands of up to
// maxCommandBytes between replicas: one batch of messages (up to
// maxBatchBytes, see transport.go) plus one entry of the largest size.
func MessageBytesFor(maxCommandBytes int) int {
	if maxCommandBytes <= 0 {
		maxCommandBytes = DefaultMaxCommandBytes
	}
	return maxCommandBytes + maxBatchBytes + messageOverhead
}

// ServerOptions are the gRPC server options a process hosting a replica
// with the default command limit should use, so Raft batches and snapshot
// chunks fit.
func ServerOptions() []grpc.ServerOption { return ServerOptionsFor(DefaultMaxCommandBytes) }

// ServerOptionsFor are the gRPC server options for replicas whose
// Config.MaxCommandBytes is maxCommandBytes. The receive limit is also what
// one client request may carry on the process's shared server.
func ServerOptionsFor(maxCommandBytes int) []grpc.ServerOption {
	n := MessageBytesFor(maxCommandBytes)
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(n), grpc.MaxSendMsgSize(n)}
}

// callOptions are the per-call options of the replica's own connections to
// its peers (Raft batches, snapshot chunks).
// dialPeer opens a connection to a peer replica at addr.
func (r *Replica) dialPeer(addr string) (*grpc.ClientConn, error) {
	creds := r.cfg.PeerCredentials
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	return grpc.NewClient(grpcdial.Target(addr), grpc.WithTransportCredentials(creds), grpcdial.Reconnect(), r.callOptions())
}

func (r *Replica) callOptions() grpc.DialOption {
	n := MessageBytesFor(r.cfg.MaxCommandBytes)
	return grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(n), grpc.MaxCallRecvMsgSize(n))
}

// MaxCommandBytes is the largest command Propose accepts.
func (r *Replica) MaxCommandBytes() int { return r.cfg.MaxCommandBytes }

func checkCommandLimit(n int) error {
	if n < 0 || n > MaxCommandBytesLimit {
		return fmt.Errorf("raftgroup: MaxCommandBytes %d: want 1 to %d", n, MaxCommandBytesLimit)
	}
	return nil
}
