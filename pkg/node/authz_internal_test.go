package node

import (
	"testing"

	"google.golang.org/grpc"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// TestEveryRPCHasARule: a method without a rule is refused to everyone,
// so a new RPC would fail closed; this test makes the omission show up
// here, not as a refusal in production. A rule for a method no service
// has is a typo.
func TestEveryRPCHasARule(t *testing.T) {
	seen := map[string]bool{}
	for _, sd := range []grpc.ServiceDesc{shardkvpb.Raft_ServiceDesc, shardkvpb.Admin_ServiceDesc, shardkvpb.Controller_ServiceDesc, shardkvpb.KV_ServiceDesc} {
		var names []string
		for _, m := range sd.Methods {
			names = append(names, m.MethodName)
		}
		for _, s := range sd.Streams {
			names = append(names, s.StreamName)
		}
		for _, n := range names {
			full := "/" + sd.ServiceName + "/" + n
			seen[full] = true
			if _, ok := authzRules[full]; !ok {
				t.Errorf("%s has no authorization rule", full)
			}
		}
	}
	for m := range authzRules {
		if !seen[m] {
			t.Errorf("rule for %s, which no service has", m)
		}
	}
}
