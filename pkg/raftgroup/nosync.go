//go:build shardkv_nosync

package raftgroup

// Built with -tags shardkv_nosync: badger does not sync each write, as
// before SyncWrites (DB.Sync after each Ready syncs only the active
// memtable's log). Only for showing that the power-cut tests catch it
// (SHARDKV_NODE_BUILD_TAGS=shardkv_nosync, docs/engine.md); writes
// acknowledged by such a binary can be lost in a power cut.
func init() { syncWrites = false }
