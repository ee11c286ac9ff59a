// Package raftgroup is shardkv's replicated state-machine engine: one Raft
// group member (a Replica) built on go.etcd.io/raft/v3, badger and gRPC. The
// shard controller and every data group are state machines on it.
//
// # Building a state machine
//
// Implement StateMachine:
//
//   - Open(db) gets the replica's badger DB and returns the applied index
//     stored in it. Keys starting with byte 0x00 belong to the engine; the
//     state machine owns every other key.
//   - Apply(b, entries) applies committed entries in log order into the
//     Ready's Batch (b.Txn), stores the last entry's index in the same
//     transaction, and publishes in-memory state in b.AfterCommit. Set
//     Entry.Result to hand a value back to the proposer. Use Entry.Time, the
//     group's time recorded in the log, for anything time-based. Never let
//     Go map order or local clocks influence the state. A state machine
//     whose reads change with time implements TimeDependent, and the
//     leader keeps the log clock fresh while it says so (docs/time.md).
//   - Snapshot() returns a point-in-time view (a badger read transaction)
//     that streams itself; Restore(r) clears the state and streams it back in.
//     A state machine whose state is a few key prefixes, with its applied
//     index under one key, gets Open, Snapshot and Restore from a
//     PrefixStore (built on PrefixSnapshot and RestorePrefixes) and reads
//     its records with GetValue, GetProto and LoadApplied.
//
// Then open a replica and serve it:
//
//	r, err := raftgroup.Open(raftgroup.Config{GroupID: 1, ID: 1, Addr: addr,
//		Dir: dir, Peers: peers}, sm)
//	srv := grpc.NewServer(raftgroup.ServerOptions()...)
//	r.RegisterGRPC(srv) // Raft transport + Admin service
//	go srv.Serve(lis)
//
// # Writing and reading
//
// Replica.Propose(ctx, cmd) returns the result of that very command, matched
// by a proposal id and the index and term it was appended at. Its errors say
// whether a retry is safe:
//
//   - IsNotExecuted(err): the command never entered the log or was provably
//     overwritten; retry it (a *NotLeaderError names the leader).
//   - IsOutcomeUnknown(err): it may still apply (timeout, leadership lost
//     after appending). Only idempotent commands may be retried blindly.
//
// Replica.ReadIndex(ctx) is a linearizable read barrier that writes nothing
// to the log: after it returns, local reads see every write that completed
// before the call. It works on followers too. Concurrent callers share one
// ReadIndex round (Metrics().ReadIndexRounds vs ReadIndexReads).
//
// # Durability
//
// The Ready loop persists hard state and entries, and the state machine's
// changes for the Ready's committed entries, in one badger commit: one
// fsync per Ready (badger's SyncWrites), before a follower sends any
// message and before any proposer or reader hears of the changes. A write
// is acknowledged only once a quorum has it on disk.
//
// # Membership
//
// AddLearner, Promote and RemoveMember use single-step ConfChangeV2 changes,
// one at a time. A new replica starts empty with Config.Join and catches up
// from the log or a streamed snapshot before it is promoted.
// TransferLeadership hands leadership over. The Admin gRPC service exposes
// all of this plus Status.
//
// # Leader-only work
//
// IsLeader and Leader say who leads now. A loop that works only while
// leading waits in AwaitLeading (or on RoleChanged) rather than polling
// on a timer, so an idle follower wakes only for Raft's own traffic.
//
// The design and its reasons are in docs/engine.md.
package raftgroup
