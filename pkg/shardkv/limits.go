package shardkv

import (
	"fmt"

	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// Size limits. MaxValueBytes is the one source of truth for how large a
// value may be: the front ends read it from the Group (Group.MaxValueBytes).
// A value travels whole in one log entry (a write, or its shard's install
// entry when the shard moves), so the engine's entry limit must hold the
// largest write: EntryBytesFor.
const (
	// DefaultMaxValueBytes is the default GroupConfig.MaxValueBytes.
	DefaultMaxValueBytes = 8 << 20
	// MaxValueBytesLimit is the largest MaxValueBytes a group accepts.
	MaxValueBytesLimit = 32 << 20
	// DefaultMaxKeyBytes is the default GroupConfig.MaxKeyBytes.
	DefaultMaxKeyBytes = 64 << 10
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

// One write entry is applied in one badger transaction, whose limit (about
// 2.4 MiB with the engine's memtables) counts values under badger's value
// threshold (1 MiB) in full and larger ones as a pointer, and Apply may add
// an entry to a transaction that already holds up to 1 MiB. The entry limit
// is far above that, so a batch may carry at most maxSmallValueBytes of
// values under the threshold (what the 1 MiB entry limit allowed before);
// values at or above it are not limited beyond the entry limit.
const (
	valueThreshold     = 1 << 20 // raftgroup's badger ValueThreshold
	maxSmallValueBytes = 1 << 20
)

// checkWriteBatch refuses a batch whose small values would not fit one
// badger transaction at apply. A single op is never refused here: its key
// (64 KiB) and value (under 1 MiB) fit beside what the transaction holds.
func checkWriteBatch(ops []*shardkvpb.WriteOp) error {
	n := 0
	for _, op := range ops {
		if v := len(op.GetValue()); v < valueThreshold {
			n += v
		}
		n += len(op.GetKey())
	}
	if n > maxSmallValueBytes && len(ops) > 1 { // one op alone always fits
		return shardkvpb.Error(codes.InvalidArgument, shardkvpb.ReasonTooLarge,
			fmt.Sprintf("the batch carries %d bytes of keys and values under 1 MiB; one log entry takes at most %d (split the batch)", n, maxSmallValueBytes), nil)
	}
	return nil
}
