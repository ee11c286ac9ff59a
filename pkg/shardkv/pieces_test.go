package shardkv

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/proto"
)

// TestInstallPieces: every received record is installed once, in order;
// each install entry holds at most ChunkLimit of records unless a single
// record is larger, and its encoded command stays within the entry limit.
func TestInstallPieces(t *testing.T) {
	var kvs []*shardkvpb.KeyValue
	for i, n := range []int{10, 100 << 10, 200 << 10, 3 << 20, 5, 5, 300 << 10, 1} {
		kvs = append(kvs, &shardkvpb.KeyValue{Key: fmt.Appendf(nil, "d\x00\x01k%04d", i), Record: bytes.Repeat([]byte{'v'}, n)})
	}
	for _, maxCmd := range []int{24 << 20, 150 << 10} {
		after := []byte("d\x00\x01kprev")
		pieces := installPieces(kvs, after, maxCmd)
		var got []*shardkvpb.KeyValue
		for _, p := range pieces {
			got = append(got, p...)
			size := 0
			for _, kv := range p {
				size += kvBytes(kv)
			}
			if len(p) > 1 && size > ChunkLimit {
				t.Errorf("max %d: piece of %d records holds %d bytes > ChunkLimit", maxCmd, len(p), size)
			}
			cmd := &shardkvpb.GroupCommand{Insert: &shardkvpb.InsertChunk{Shard: 1, ConfigNum: 1 << 40, AfterKey: after, Resume: true, Kvs: p, Last: true, TotalKeys: 1 << 40}}
			if n := proto.Size(cmd); len(p) > 1 && n > maxCmd {
				t.Errorf("max %d: piece of %d records encodes to %d bytes", maxCmd, len(p), n)
			}
			after = p[len(p)-1].Key
		}
		if len(got) != len(kvs) {
			t.Fatalf("max %d: %d records installed, want %d", maxCmd, len(got), len(kvs))
		}
		for i := range kvs {
			if got[i] != kvs[i] {
				t.Fatalf("max %d: record %d out of order", maxCmd, i)
			}
		}
	}
	if p := installPieces(nil, nil, 1<<20); len(p) != 1 || len(p[0]) != 0 {
		t.Fatalf("empty chunk: %v pieces, want one empty (it carries Last)", p)
	}
}
