package ctrlerclient

import (
	"context"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// Users returns the cluster's users (the Redis front ends' ACL) and their
// version, read linearizably.
func (c *Client) Users(ctx context.Context) (*shardkvpb.UsersReply, error) {
	var out *shardkvpb.UsersReply
	err := c.do(ctx, func(ctx context.Context, cl shardkvpb.ControllerClient) error {
		r, err := cl.Users(ctx, &shardkvpb.UsersRequest{})
		out = r
		return err
	})
	return out, err
}

// SetUsers adds, replaces and deletes users and returns them after the
// change. A resend after an unknown outcome is harmless: setting and
// deleting by name are idempotent.
func (c *Client) SetUsers(ctx context.Context, req *shardkvpb.SetUsersRequest) (*shardkvpb.UsersReply, error) {
	var out *shardkvpb.UsersReply
	err := c.do(ctx, func(ctx context.Context, cl shardkvpb.ControllerClient) error {
		r, err := cl.SetUsers(ctx, req)
		out = r
		return err
	})
	return out, err
}
