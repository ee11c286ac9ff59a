package controllers

import (
	"testing"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

func TestShardSummary(t *testing.T) {
	cfg := &shardkvpb.Config{Shards: []uint64{1, 1, 2, 1, 0, 1, 1, 1}}
	n, r := shardSummary(cfg, 1)
	if n != 6 || r != "0-1,3,5-7" {
		t.Fatalf("got %d %q", n, r)
	}
	if n, r := shardSummary(cfg, 3); n != 0 || r != "" {
		t.Fatalf("got %d %q", n, r)
	}
}
