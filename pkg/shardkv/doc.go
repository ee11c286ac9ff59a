// Package shardkv is a data group: a Raft group (on pkg/raftgroup) that owns
// shards as the controller's configs say, steps through configs one at a
// time, pulls shards it gains from their previous owners, and garbage-collects
// the shards it gave away. See docs/shardkv.md for the shard state diagram.
//
// The package knows no client protocol. It answers every API with neutral
// facts: a result, or a *shardkvpb.Refusal (not executed: which group owns
// the shard by the newest config known, who leads it), or an error wrapping
// shardkvpb.ErrOutcomeUnknown. The gRPC edge renders those with
// shardkvpb's status helpers, pkg/resp as Redis replies.
//
// The service (Group), one idea per file:
//
//	group.go     configuration, start and stop
//	handlers.go  the gRPC KV service (client API)
//	handoff.go   the gRPC shard hand-off calls and their caller checks
//	limits.go    value, key and entry size limits
//	frontend.go  the API of protocol front ends (ReadKeys, WriteBatch)
//	submit.go    the one write path every API goes through
//	refusal.go   where a request the group does not execute belongs
//	topology.go  what the replica knows beyond its state: newer configs, leaders
//	scan.go      local-state scans (key counts, slots, SCAN-style cursors)
//	peers.go     connections to other groups
//	migrate.go   the leader's loop: stepping configs, pulling, confirming, GC
//	report.go    the heartbeat to the controller
//
// The replicated state (StateMachine):
//
//	statemachine.go  the type, Open and load
//	layout.go        storage keys and value records
//	apply.go         applying log entries (a write command all or nothing)
//	recordcache.go   apply's last small writes, read before the LSM tree
//	budget.go        what one write command may write: limits, worst case
//	ops.go           what one write op does to a record
//	sessions.go      exactly-once sessions of pipelining clients
//	configs.go       stepping from config N to N+1
//	transfer.go      shard transfer: streaming out, installing, deleting
//	expiry.go        session, tombstone and key expiry
//	reads.go         local reads and routing
//	snapshot.go      snapshots
package shardkv
