package resp

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// flushBatch is how many keys one DEL entry of FLUSHALL deletes: well
// inside a command's write budget (4 records a key).
const flushBatch = 1000

// cmdFlush serves FLUSHALL and FLUSHDB [ASYNC | SYNC]: delete every key of
// the shards the group of the replica asked serves, as Redis Cluster's
// FLUSHALL empties the node asked. Only the leader runs it (a follower
// answers READONLY, as a Redis replica does). The keys are deleted in
// entries of flushBatch keys as a scan of the leader's state reaches
// them, so it is not atomic: a key written behind the scan survives
// (docs/redis.md). ASYNC is accepted and runs as SYNC: the reply comes
// when the keys are gone.
func cmdFlush(c *conn, p *pipeline, args [][]byte, _ int) {
	if len(args) > 2 || (len(args) == 2 && !strings.EqualFold(string(args[1]), "async") && !strings.EqualFold(string(args[1]), "sync")) {
		p.reply(errReply(errSyntax))
		return
	}
	p.barrier()
	if !c.s.b.Topology().Leads {
		p.reply(errReply("READONLY You can't write against a read only replica."))
		return
	}
	n, err := c.s.flush()
	if err != nil {
		p.reply(errReply(fmt.Sprintf("ERR %s stopped after deleting %d keys: %v", strings.ToUpper(string(args[0])), n, err)))
		return
	}
	p.reply(okReply())
}

// flush deletes the keys this replica's state lists, in batches; it
// returns how many it deleted.
func (s *Server) flush() (int, error) {
	deleted := 0
	var after []byte
	for first := true; first || after != nil; first = false {
		keys, next, err := s.b.Scan(after, flushBatch, nil)
		if err != nil {
			return deleted, err
		}
		after = next
		if len(keys) == 0 {
			continue
		}
		ops := make([]*shardkvpb.WriteOp, len(keys))
		for i, k := range keys {
			ops[i] = &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_DELETE, Key: k}
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.WriteTimeout)
		outs, err := s.b.WriteBatch(ctx, ops)
		cancel()
		var ref *shardkvpb.Refusal
		switch {
		case errors.As(err, &ref):
			return deleted, fmt.Errorf("the group refused the deletes (%s); nothing of this batch ran", ref.Reason)
		case err != nil:
			return deleted, err
		}
		for _, o := range outs {
			// A key whose shard left the group meanwhile is refused:
			// it is no longer this node's to flush.
			if o.Err == nil && o.Result.GetOk() {
				deleted++
			}
		}
	}
	return deleted, nil
}

// cmdFunctionFlush: FUNCTION FLUSH [ASYNC | SYNC]. shardkv runs no
// functions (no scripting), so there are none to delete; the Redis test
// suite's harness sends it before every test.
func cmdFunctionFlush(_ *conn, p *pipeline, args [][]byte, _ int) {
	switch {
	case len(args) > 3:
		p.reply(errReply(fmt.Sprintf("ERR unknown subcommand or wrong number of arguments for '%s'. Try FUNCTION HELP.", trunc(args[1], 128))))
	case len(args) == 3 && !strings.EqualFold(string(args[2]), "async") && !strings.EqualFold(string(args[2]), "sync"):
		p.reply(errReply("ERR FUNCTION FLUSH only supports SYNC|ASYNC option"))
	default:
		p.reply(okReply())
	}
}
