package shardkv_test

import (
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// Disk bound of TestGCReclaimsMovedShards, per replica. "own" is the bytes
// (key + value) of the keys whose shard the replica's group owns in the
// final config.
//
//   - rest = allocated disk outside badger's write buffers (SST tables below
//     L0, value log, spooled snapshots, manifest...) must stay within
//     gcOwnFactor*own + gcLogAllowance + gcMiscOverhead: once a shard has left,
//     neither its data nor the log entries that carried it may pile up.
//   - buffers = the memtable WALs (*.mem) and the L0 tables not yet
//     compacted. badger recycles them on its own; they are bounded by its
//     options (pkg/raftgroup/options.go: 2 memtables of 16 MiB, L0 compacted
//     from 4 tables of at most a memtable each), so the whole replica stays
//     within rest's bound plus gcBufferOverhead.
const (
	gcKeys         = 4000
	gcValueBytes   = 1000
	gcOwnFactor    = 2
	gcMiscOverhead = 1 << 20
	// The test bounds the engine's log retention (SnapshotBytes applied
	// bytes between markers, TrailingBytes kept after a compaction), and the
	// retained log may hold one command above both (here at most a 256 KiB
	// shard chunk with its framing).
	gcSnapshotBytes  = 512 << 10
	gcTrailingBytes  = 256 << 10
	gcLogAllowance   = gcSnapshotBytes + gcTrailingBytes + 512<<10
	gcBufferOverhead = 2*16<<20 + 4*16<<20
)

// gcAllocated is the disk space of a file tree as du counts it (allocated
// blocks, not apparent sizes: badger's mmapped files are sparse).
func gcAllocated(dir string, skip func(path string) bool) (int64, map[string]int64) {
	var total int64
	byKind := map[string]int64{}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil // removed meanwhile (a compaction)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		b := st.Blocks * 512
		kind := filepath.Ext(p)
		if kind == "" {
			kind = filepath.Base(p)
		}
		if skip != nil && skip(p) {
			kind = "buffer" + kind
		}
		byKind[kind] += b
		total += b
		return nil
	})
	return total, byKind
}

func gcMiB(n int64) string { return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20)) }

func gcRandValue(rng *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.IntN(256))
	}
	return string(b)
}

// TestGCReclaimsMovedShards moves 2000 keys of 1 KB values around three
// groups through several rounds of joins and leaves, and checks after every
// round that (a) no replica of a group keeps any key of a shard its group
// does not own (the old owners' copies were deleted) and (b) every replica's
// allocated disk stays within the bound above.
func TestGCReclaimsMovedShards(t *testing.T) {
	const nshards = 16
	w := kvtest.New(t, kvtest.Options{Shards: nshards, RaftConfig: func(c *raftgroup.Config) {
		c.SnapshotBytes, c.TrailingBytes = gcSnapshotBytes, gcTrailingBytes
	}})
	gids := []uint64{100, 101, 102}
	for _, g := range gids {
		w.StartGroup(g)
	}
	w.Join(100)
	w.WaitSettled(20 * time.Second)
	c := w.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	rng := rand.New(rand.NewPCG(rand.Uint64(), 2))
	want := map[string]string{}
	shardBytes := make([]int64, nshards)
	var keys []string
	for i := range gcKeys {
		k := fmt.Sprintf("gc-%05d", i)
		want[k] = gcRandValue(rng, gcValueBytes)
		keys = append(keys, k)
		shardBytes[routing.ShardOf([]byte(k), nshards)] += int64(len(k) + gcValueBytes)
	}
	for i := 0; i < len(keys); i += 40 {
		batch := map[string]string{}
		for _, k := range keys[i:min(i+40, len(keys))] {
			batch[k] = want[k]
		}
		if err := c.MultiPut(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}

	check := func(step string, conf *shardkvpb.Config, final bool) {
		t.Helper()
		for _, gid := range gids {
			var own int64
			for s, o := range conf.Shards {
				if o == gid {
					own += shardBytes[s]
				}
			}
			for _, id := range w.Groups[gid].IDs() {
				sm := w.SM(gid, id)
				r := w.Groups[gid].Replica(id)
				if sm == nil || r == nil {
					t.Fatalf("%s: g%d/%d is down", step, gid, id)
				}
				// (a) nothing left of shards the group gave away.
				for s := range nshards {
					if conf.Shards[s] == gid {
						continue
					}
					if n, err := sm.CountKeys(s); err != nil || n != 0 {
						t.Fatalf("%s: g%d/%d still holds %d keys of shard %d (owner %d) (err %v)", step, gid, id, n, s, conf.Shards[s], err)
					}
				}
				// (b) disk. A compaction in flight briefly holds both its
				// inputs and its outputs: measure again for a few seconds
				// before calling it a failure.
				restBound := gcOwnFactor*own + gcLogAllowance + gcMiscOverhead
				var total, rest int64
				var kinds map[string]int64
				for try := 0; ; try++ {
					l0 := map[string]bool{}
					for _, ti := range r.DB().Tables() {
						if ti.Level == 0 {
							l0[fmt.Sprintf("%06d.sst", ti.ID)] = true
						}
					}
					total, kinds = gcAllocated(w.Groups[gid].Nodes[id].Dir, func(p string) bool {
						return strings.HasSuffix(p, ".mem") || l0[filepath.Base(p)]
					})
					rest = total
					for k, b := range kinds {
						if strings.HasPrefix(k, "buffer") {
							rest -= b
						}
					}
					if (rest <= restBound && total <= restBound+gcBufferOverhead) || try == 30 {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				t.Logf("%s: g%d/%d own %s: total %s, outside write buffers %s (bound %s) %v", step, gid, id, gcMiB(own), gcMiB(total), gcMiB(rest), gcMiB(restBound), gcKinds(kinds))
				if rest > restBound {
					t.Errorf("%s: g%d/%d: %s allocated outside badger's write buffers, bound %s (2 x own data %s + log %s + %s): %v",
						step, gid, id, gcMiB(rest), gcMiB(restBound), gcMiB(own), gcMiB(gcLogAllowance), gcMiB(gcMiscOverhead), gcKinds(kinds))
				}
				if total > restBound+gcBufferOverhead {
					t.Errorf("%s: g%d/%d: %s allocated, bound %s", step, gid, id, gcMiB(total), gcMiB(restBound+gcBufferOverhead))
				}
				// Every group took in far more than SnapshotBytes of shard
				// chunks, in far fewer entries than SnapshotEntries: the log
				// was compacted by size.
				if st := r.StatusProto(); final && st.FirstIndex <= 1 {
					t.Errorf("%s: g%d/%d: log never compacted (entries %d..%d)", step, gid, id, st.FirstIndex, st.LastIndex)
				}
			}
		}
		if t.Failed() {
			t.FailNow()
		}
	}

	steps := []struct {
		join bool
		gid  uint64
	}{
		{true, 101}, {true, 102}, {false, 100}, {true, 100}, {false, 101}, {true, 101},
		{false, 102}, {true, 102}, {false, 100}, {true, 100}, {false, 101}, {true, 101},
	}
	for i, s := range steps {
		name := fmt.Sprintf("step %d (leave %d)", i, s.gid)
		if s.join {
			name = fmt.Sprintf("step %d (join %d)", i, s.gid)
			w.Join(s.gid)
		} else {
			w.Leave(s.gid)
		}
		conf := w.WaitSettled(60 * time.Second)
		if i%3 == 2 || i == len(steps)-1 {
			check(name, conf, i == len(steps)-1)
		}
	}

	// Every value survived the moves.
	got, err := c.MultiGet(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if got[k] != want[k] {
			t.Fatalf("%s: got %d bytes, want the %d bytes written", k, len(got[k]), len(want[k]))
		}
	}
}

func gcKinds(m map[string]int64) string {
	var parts []string
	for _, k := range []string{".sst", "buffer.sst", "buffer.mem", ".vlog", ".snap", "MANIFEST", "DISCARD"} {
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s=%s", k, gcMiB(m[k])))
		}
	}
	var other int64
	for k, b := range m {
		switch k {
		case ".sst", "buffer.sst", "buffer.mem", ".vlog", ".snap", "MANIFEST", "DISCARD":
		default:
			other += b
		}
	}
	parts = append(parts, "other="+gcMiB(other))
	return strings.Join(parts, " ")
}
