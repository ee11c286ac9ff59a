package ctrler

import (
	"encoding/json"
	"fmt"
	"math"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/proto"
)

// The controller's log entries are shardkvpb.ControllerCommand messages, as
// a data group's are GroupCommand messages. Controllers before that logged
// JSON objects; those are still decoded (and applied exactly as they were),
// so an existing cluster's log replays and a lagging replica catches up.

// clientRequest is a logged client mutation: its client id and sequence
// number make it exactly once.
type clientRequest interface {
	GetClientId() uint64
	GetSeq() uint64
}

// request returns cmd's client mutation, or nil for the leader's own
// commands (init, compact, cut-over) and for a command without an operation.
func request(cmd *shardkvpb.ControllerCommand) clientRequest {
	switch op := cmd.GetOp().(type) {
	case *shardkvpb.ControllerCommand_Join:
		return op.Join
	case *shardkvpb.ControllerCommand_Leave:
		return op.Leave
	case *shardkvpb.ControllerCommand_Move:
		return op.Move
	case *shardkvpb.ControllerCommand_Unpin:
		return op.Unpin
	}
	return nil
}

func encodeCommand(cmd *shardkvpb.ControllerCommand) ([]byte, error) {
	b, err := proto.Marshal(cmd)
	if err != nil {
		return nil, fmt.Errorf("encode controller command: %w", err)
	}
	return b, nil
}

// decodeCommand decodes one log entry. A JSON entry starts with '{', the
// tag of field 15 (wire type 3), which ControllerCommand reserves: no
// protobuf entry starts with it.
func decodeCommand(b []byte) (*shardkvpb.ControllerCommand, error) {
	if len(b) > 0 && b[0] == '{' {
		return decodeJSONCommand(b)
	}
	cmd := &shardkvpb.ControllerCommand{}
	if err := proto.Unmarshal(b, cmd); err != nil {
		return nil, err
	}
	return cmd, nil
}

// jsonCommand is the JSON log entry of earlier controllers.
type jsonCommand struct {
	Op        string             `json:"op"`
	ClientID  uint64             `json:"client,omitempty"`
	Seq       uint64             `json:"seq,omitempty"`
	Shards    int                `json:"shards,omitempty"`
	Placement string             `json:"placement,omitempty"`
	Groups    []*shardkvpb.Group `json:"groups,omitempty"`
	GIDs      []uint64           `json:"gids,omitempty"`
	Shard     int                `json:"shard,omitempty"`
	GID       uint64             `json:"gid,omitempty"`
	Below     uint64             `json:"below,omitempty"`
}

func decodeJSONCommand(b []byte) (*shardkvpb.ControllerCommand, error) {
	var c jsonCommand
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, err
	}
	// Earlier controllers filled these from uint32 request fields (and the
	// shard count from a flag that init refused past 16384).
	if c.Shards < 0 || c.Shards > math.MaxUint32 || c.Shard < 0 || c.Shard > math.MaxUint32 {
		return nil, fmt.Errorf("shard number out of range in %q entry", c.Op)
	}
	cmd := &shardkvpb.ControllerCommand{}
	switch c.Op {
	case "init":
		cmd.Op = &shardkvpb.ControllerCommand_Init{Init: &shardkvpb.ControllerInit{Shards: uint32(c.Shards), Placement: c.Placement}}
	case "join":
		cmd.Op = &shardkvpb.ControllerCommand_Join{Join: &shardkvpb.JoinRequest{ClientId: c.ClientID, Seq: c.Seq, Groups: c.Groups}}
	case "leave":
		cmd.Op = &shardkvpb.ControllerCommand_Leave{Leave: &shardkvpb.LeaveRequest{ClientId: c.ClientID, Seq: c.Seq, Gids: c.GIDs}}
	case "move":
		cmd.Op = &shardkvpb.ControllerCommand_Move{Move: &shardkvpb.MoveRequest{ClientId: c.ClientID, Seq: c.Seq, Shard: uint32(c.Shard), Gid: c.GID}}
	case "unpin":
		cmd.Op = &shardkvpb.ControllerCommand_Unpin{Unpin: &shardkvpb.UnpinRequest{ClientId: c.ClientID, Seq: c.Seq, Shard: uint32(c.Shard)}}
	case "compact":
		cmd.Op = &shardkvpb.ControllerCommand_Compact{Compact: &shardkvpb.ControllerCompact{Below: c.Below}}
	default:
		return nil, fmt.Errorf("unknown operation %q", c.Op)
	}
	return cmd, nil
}
