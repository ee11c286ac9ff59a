package shardkv

import (
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"google.golang.org/grpc"
)

// Size limits. MaxValueBytes is the one source of truth for how large a
// value may be: the front ends read it from the Group (Group.MaxValueBytes).
// A value travels whole in one log entry (a write, or its shard's install
// entry when the shard moves), so the engine's entry limit must hold the
// largest write: EntryBytesFor.
const (
	// DefaultMaxValueBytes is the default GroupConfig.MaxValueBytes.
	DefaultMaxValueBytes = 8 << 20
	// MaxValueBytesLimit is the largest MaxValueBytes a group accepts
	// (badger's value-log files are 64 MiB).
	MaxValueBytesLimit = 32 << 20
	// DefaultMaxKeyBytes is the default GroupConfig.MaxKeyBytes: the
	// largest key every stored form of which fits badger.
	DefaultMaxKeyBytes = MaxKeyBytesLimit
	// entryOverhead covers a write's framing in its log entry (the op's
	// other fields, the session, the command and the engine's header) and
	// a shard install entry's (record header, resume key framing).
	entryOverhead = 1 << 20
)

// EntryBytesFor is the engine entry limit (raftgroup.Config.MaxCommandBytes)
// a group needs for values of maxValue and keys of maxKey bytes: one write
// may carry two values (CAS: the expected and the new one) and its key, and
// one shard install entry carries a record (key and value) with the
// previous chunk's last key.
func EntryBytesFor(maxValue, maxKey int) int {
	return 2*maxValue + 2*maxKey + entryOverhead
}

// maxValueFor is the largest value the entry limit maxCommand carries.
func maxValueFor(maxCommand, maxKey int) int {
	return (maxCommand - 2*maxKey - entryOverhead) / 2
}

// transferCallOptions let group-to-group calls receive install chunks of
// the largest record the engine's entry limit carries.
func transferCallOptions(maxCommand int) grpc.DialOption {
	n := raftgroup.MessageBytesFor(maxCommand)
	return grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(n), grpc.MaxCallSendMsgSize(n))
}
