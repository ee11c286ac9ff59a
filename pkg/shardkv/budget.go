package shardkv

import (
	"fmt"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc/codes"
)

// What one write command may ask of storage. A write command is one log
// entry and is applied in one badger transaction, so it must fit one: the
// check before proposing (checkBudget) refuses a command whose worst case
// does not, and apply refuses (COMMAND_TOO_LARGE, nothing written) one whose
// real writes do not, which a command accepted here never reaches.
//
// The limits are constants, not read from the DB's options, because apply
// decides with them: every replica must refuse the same entries whatever
// its options. StateMachine.Open checks that the DB's real limits hold them.
const (
	// badgerMaxKey is badger's key limit (txn.go: 65,000 bytes).
	badgerMaxKey = 65000
	// longestKeyPrefix is what the longest stored key adds to a user key:
	// the expiry index, 'x' expireAt:8 shard:2 (dataKey adds 4, the
	// tombstone index 3).
	longestKeyPrefix = 11
	// MaxKeyBytesLimit is the largest user key every stored form of which
	// fits badger: the default and the maximum of GroupConfig.MaxKeyBytes.
	MaxKeyBytesLimit = badgerMaxKey - longestKeyPrefix
	// EntryMaxRecords and EntryMaxBytes bound the records one write command
	// writes (values, their indexes, sessions), counted as badger counts a
	// transaction (recordCost). badger allows fewer than 26,214 records and
	// 2,516,582 bytes per transaction with raftgroup's 16 MiB memtables;
	// these leave room for the applied index and log time.
	EntryMaxRecords = 24_000
	EntryMaxBytes   = 2 << 20
	// EntryMaxResultBytes bounds the previous values one write command's
	// ops return (reads made in a write batch, GETSET and the like): every
	// replica holds them until the entry's apply ends, so a batch of a
	// thousand reads of one 8 MiB key would hold 8 GiB on each. An op past
	// it fails with OpErrResultTooLarge and changes nothing, the same on
	// every replica. Front ends keep their batches below it.
	EntryMaxResultBytes = 64 << 20
	// CollMetaMaxBytes is the largest value of a collection's record (its
	// metadata, with a sorted set's or set's pop bounds): front ends that
	// count a command's writes before proposing it use it.
	CollMetaMaxBytes = collMetaLen
	// valueInline: a value this long or longer goes to badger's value log
	// and counts as a 12-byte pointer (raftgroup's ValueThreshold, 1 MiB).
	valueInline = 1 << 20
	// badgerRecordOverhead is what badger adds per record: 2 meta bytes
	// and an 8-byte version (+2).
	badgerRecordOverhead = 12
	// maxFloatValue bounds an INCRBYFLOAT result ('f' format of a float64).
	maxFloatValue = 400
)

// Entries other than write commands that write records of user keys (key
// expiry, session expiry with the tombstone purge, GC chunks) are bounded
// per entry in bytes as well as in keys: keys may be 64 KB, and a thousand
// of them with their index entries are over 100 MB, far past one
// transaction (Apply would fail on every replica). Each such entry stops
// before the key whose writes would take it past maintBytes, as badger
// counts them (recordCost); its first key always goes, so every entry makes
// progress, and the next entry of its kind goes on from there.
//
// maintMax is the most one of them writes: maintBytes, or one key's work
// alone (at most a record below badger's value threshold: a legacy
// tombstone the purge stamps), plus the session expiry beside the purge
// (DeleteChunkKeys × 2 short records) and a shard meta or the purge cursor
// carrying one key. Expiring a key is 4 records, the rest 2 per key.
const (
	maintBytes      = 512 << 10
	maintMaxRecords = 4*max(DeleteChunkKeys, ExpireKeysBatch) + 8
	maintMaxBytes   = valueInline + 256<<10
)

// metaMaxBytes bounds an encoded ShardMeta: JSON, its Resume key and its
// copy Cursor (each at most badgerMaxKey bytes) in base64, and the other
// fields.
const metaMaxBytes = 2*4*(badgerMaxKey+2)/3 + 1024

// recordCost is a record's size as badger counts it toward a transaction
// (Entry.estimateSize plus the version), at most; a delete has no value.
func recordCost(key, value int) int {
	if value >= valueInline {
		value = 12
	}
	return key + value + badgerRecordOverhead
}

// commitCost is what commit adds: the applied index and the log time.
var commitCost = recordCost(len(keyApplied), 8) + recordCost(len(keyLogTime), 8)

const commitRecords = 2

// checkLimits refuses a DB whose transaction or value limits are smaller
// than the constants above assume (a change of raftgroup's badger options).
func checkLimits(db *badger.DB) error {
	o := db.Opts()
	switch {
	case db.MaxBatchCount() <= EntryMaxRecords+commitRecords || db.MaxBatchSize() <= int64(EntryMaxBytes+commitCost):
		return fmt.Errorf("badger allows %d records and %d bytes per transaction; a write command may need %d and %d",
			db.MaxBatchCount(), db.MaxBatchSize(), EntryMaxRecords+commitRecords, EntryMaxBytes+commitCost)
	case o.ValueThreshold > valueInline:
		return fmt.Errorf("badger value threshold %d is above the %d the write budget assumes", o.ValueThreshold, valueInline)
	case o.ValueLogFileSize < MaxValueBytesLimit+2*recordHeader:
		return fmt.Errorf("badger value-log files of %d bytes cannot hold a %d-byte value", o.ValueLogFileSize, MaxValueBytesLimit)
	}
	return nil
}

// budget is a count of records and their badger bytes.
type budget struct{ records, bytes int }

func (b *budget) add(key, value int) {
	b.records++
	b.bytes += recordCost(key, value)
}

// addKey adds what writing a key of k bytes with a value of v bytes may
// cost: the record, its tombstone index entry (set or deleted), the delete
// of its old expiry index entry and a change index entry (a planned move).
func (b *budget) addKey(k, v int) {
	b.add(4+k, recordHeader+v)
	b.add(3+k, 0)
	b.add(11+k, 0)
	b.add(11+k, 0)
}

// addElem adds what writing an element of a key of k bytes may cost: the
// element (field f, value v) and its change index entry.
func (b *budget) addElem(k, f, v int) {
	b.add(4+2+k+8+f, 1+v)
	b.add(4+6+1+2+k+8+f, 0)
}

func (b budget) fits() bool { return b.records <= EntryMaxRecords && b.bytes <= EntryMaxBytes }

// worstCase is the most a write command's ops may write at apply. apply
// buffers a command's records with the last write of each key winning, so
// a key written by several ops (a pipeline's APPENDs to one log key) costs
// once: its value record, with the largest value any of its ops may leave
// (maxValue for an op that keeps or grows the current one), its tombstone
// index, the delete of its old expiry index entry and a change index entry
// (written while a move of the shard is planned); plus one new expiry
// index entry per op that may set one (each may name a different time).
// Per client session touched (one per shard): its record and its two
// expiry index entries.
func worstCase(ops []*shardkvpb.WriteOp, shards, maxValue int) budget {
	var b budget
	type sess struct {
		shard  int
		client uint64
	}
	seen := map[sess]bool{}
	largest := map[string]int{} // distinct keys: the largest value left
	var order []string
	for _, op := range ops {
		k := len(op.Key)
		v := 0
		switch op.Kind {
		case shardkvpb.WriteOp_PUT, shardkvpb.WriteOp_CAS:
			v = len(op.Value)
		case shardkvpb.WriteOp_APPEND, shardkvpb.WriteOp_EXPIRE, shardkvpb.WriteOp_PERSIST, shardkvpb.WriteOp_SET_RANGE, shardkvpb.WriteOp_SET_BIT:
			v = maxValue
		case shardkvpb.WriteOp_MSET_NX:
			v = len(op.Value)
			for i, mk := range op.MoreKeys {
				b.addKey(len(mk), len(op.MoreValues[i]))
			}
		case shardkvpb.WriteOp_RENAME, shardkvpb.WriteOp_COPY:
			// The source keeps its value or becomes a tombstone; the
			// destination takes a value of up to maxValue and the
			// source's expiry.
			b.addKey(len(op.Dest), maxValue)
			b.add(11+len(op.Dest), 0) // its new expiry index entry
		case shardkvpb.WriteOp_INCR:
			v = 20
		case shardkvpb.WriteOp_INCR_FLOAT:
			v = maxFloatValue
		case shardkvpb.WriteOp_LPUSH, shardkvpb.WriteOp_RPUSH:
			v = collMetaLen
			for _, f := range op.Fields {
				b.addElem(k, 8, len(f))
			}
		case shardkvpb.WriteOp_LPOP, shardkvpb.WriteOp_RPOP:
			v = collMetaLen
			for range op.Delta {
				b.addElem(k, 8, 0)
			}
		case shardkvpb.WriteOp_LSET:
			v = collMetaLen
			b.addElem(k, 8, len(op.Value))
		case shardkvpb.WriteOp_LMOVE:
			// The element moved is at most the value limit.
			v = collMetaLen
			b.addKey(len(op.Dest), collMetaLen)
			b.addElem(k, 8, 0)
			b.addElem(len(op.Dest), 8, maxValue)
		case shardkvpb.WriteOp_LTRIM, shardkvpb.WriteOp_LREM, shardkvpb.WriteOp_LINSERT:
			// What they rewrite is known at apply (COMMAND_TOO_LARGE past
			// the entry's budget).
			v = collMetaLen
			b.addElem(k, 8, len(op.Value))
		case shardkvpb.WriteOp_ZADD, shardkvpb.WriteOp_ZREM:
			// The member's score record, and its index entry's delete and
			// write.
			v = collMetaLen
			for _, f := range op.Fields {
				b.addElem(k, 1+len(f), 8)
				b.addElem(k, 9+len(f), 0)
				b.addElem(k, 9+len(f), 0)
			}
		case shardkvpb.WriteOp_ZPOPMIN, shardkvpb.WriteOp_ZPOPMAX:
			v = collMetaLen
			for range op.Delta {
				b.addElem(k, 64, 0)
				b.addElem(k, 72, 0)
			}
		case shardkvpb.WriteOp_ZREMRANGE:
			v = collMetaLen // what it removes is counted at apply
		case shardkvpb.WriteOp_ZSTORE, shardkvpb.WriteOp_ZRANGESTORE:
			v = collMetaLen // what it stores is counted at apply
			b.addKey(len(op.Dest), collMetaLen)
		case shardkvpb.WriteOp_SPOP:
			v = collMetaLen
			// Members are unknown before apply: counted at 64 bytes each
			// (longer ones may be refused at apply, COMMAND_TOO_LARGE).
			for range op.Delta {
				b.addElem(k, 64, 0)
			}
		case shardkvpb.WriteOp_SMOVE, shardkvpb.WriteOp_SSTORE:
			// Two records and two elements; SSTORE's result is counted at
			// apply (COMMAND_TOO_LARGE past the entry's budget).
			v = collMetaLen
			b.addKey(len(op.Dest), collMetaLen)
			for _, f := range op.Fields {
				b.addElem(k, len(f), 0)
				b.addElem(len(op.Dest), len(f), 0)
			}
		case shardkvpb.WriteOp_HSET, shardkvpb.WriteOp_HDEL, shardkvpb.WriteOp_HINCR, shardkvpb.WriteOp_HINCR_FLOAT,
			shardkvpb.WriteOp_SADD, shardkvpb.WriteOp_SREM:
			// The fields, and the record's metadata (below).
			v = collMetaLen
			for i, f := range op.Fields {
				fv := 0
				switch op.Kind {
				case shardkvpb.WriteOp_HSET:
					fv = len(op.FieldValues[i])
				case shardkvpb.WriteOp_HINCR:
					fv = 20
				case shardkvpb.WriteOp_HINCR_FLOAT:
					fv = maxFloatValue
				}
				b.addElem(k, len(f), fv)
			}
		}
		// Any op may replace a collection: its dead version's mark.
		b.add(13+k, 1)
		ks := string(op.Key)
		if prev, ok := largest[ks]; !ok {
			order = append(order, ks)
			largest[ks] = v
		} else if v > prev {
			largest[ks] = v
		}
		if op.Kind == shardkvpb.WriteOp_EXPIRE || (op.Kind == shardkvpb.WriteOp_PUT && (op.ExpireAtMs != 0 || op.TtlMs != nil)) {
			b.add(11+k, 0) // new expiry index entry
		}
		if c := op.Session.GetClientId(); c != 0 {
			seen[sess{routing.ShardOf(op.Key, max(shards, 1)), c}] = true
		}
	}
	for _, ks := range order {
		b.addKey(len(ks), largest[ks])
	}
	// Each session: its record (the entry's sessions share
	// EntrySessionBytes, see flushSessions) and two expiry index entries.
	n := len(seen)
	b.records += 3 * n
	b.bytes += n*(recordCost(len(sessionKey(0, 0)), 0)+2*recordCost(len(expiryKey(0, 0, 0)), 0)) + min(n*MaxSessionBytes, EntrySessionBytes)
	return b
}

// checkBudget refuses, before proposing, ops that could not be applied in
// one transaction.
func (g *Group) checkBudget(ops []*shardkvpb.WriteOp) error {
	b := worstCase(ops, len(g.sm.Config().Shards), g.cfg.MaxValueBytes)
	if b.fits() {
		return nil
	}
	return shardkvpb.Error(codes.InvalidArgument, shardkvpb.ReasonTooLarge,
		fmt.Sprintf("the command's %d ops may write %d records (%d bytes) to storage; one command may write at most %d records and %d bytes: send fewer keys per command",
			len(ops), b.records, b.bytes, EntryMaxRecords, EntryMaxBytes), nil)
}

// CheckBatch reports whether ops may be proposed as one entry: nil, or the
// error submit would refuse them with (invalid input, nothing executed). A
// front end that batches independent commands can cut batches with it.
func (g *Group) CheckBatch(ops []*shardkvpb.WriteOp) error {
	for _, op := range ops {
		if err := g.checkOp(op); err != nil {
			return err
		}
	}
	return g.checkBudget(ops)
}
