package ctrler

import (
	"context"
	"slices"
	"strings"

	"github.com/dgraph-io/badger/v4"
	"google.golang.org/protobuf/proto"

	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// The cluster's users: the Redis front ends' ACL, kept here so that every
// replica of every group agrees on them. The controller stores each user's
// spec without reading it (the front ends own its grammar); it only bounds
// their number and size, so that one entry's apply and every poll stay
// small.
const (
	// MaxUsers is the most users the cluster holds.
	MaxUsers = 1024
	// MaxUserNameBytes and MaxUserSpecBytes bound one user.
	MaxUserNameBytes = 128
	MaxUserSpecBytes = 4096
)

var (
	keyUsersVersion = []byte("m/usersver")
	prefixUser      = []byte("u/")
)

func userKey(name string) []byte { return append(slices.Clone(prefixUser), name...) }

// checkSetUsers refuses a request that is past the limits or malformed.
func checkSetUsers(req *shardkvpb.SetUsersRequest) error {
	if len(req.GetSet())+len(req.GetDelete()) > MaxUsers {
		return refuse("set users: %d users named, over the limit of %d", len(req.GetSet())+len(req.GetDelete()), MaxUsers)
	}
	seen := map[string]bool{}
	for _, u := range req.GetSet() {
		if err := checkUserName(u.GetName()); err != nil {
			return err
		}
		if len(u.GetSpec()) > MaxUserSpecBytes {
			return refuse("set users: user %q has a %d-byte spec, over the %d-byte limit", u.GetName(), len(u.GetSpec()), MaxUserSpecBytes)
		}
		if seen[u.GetName()] {
			return refuse("set users: user %q is set twice", u.GetName())
		}
		seen[u.GetName()] = true
	}
	for _, n := range req.GetDelete() {
		if err := checkUserName(n); err != nil {
			return err
		}
		if seen[n] {
			return refuse("set users: user %q is both set and deleted", n)
		}
	}
	return nil
}

func checkUserName(n string) error {
	switch {
	case n == "":
		return refuse("set users: a user name is empty")
	case len(n) > MaxUserNameBytes:
		return refuse("set users: a user name of %d bytes, over the %d-byte limit", len(n), MaxUserNameBytes)
	case strings.ContainsAny(n, " \t\r\n"):
		return refuse("set users: user name %q holds a space", n)
	}
	return nil
}

// readUsers reads the users and their version.
func readUsers(txn *badger.Txn) (*shardkvpb.UsersReply, error) {
	out := &shardkvpb.UsersReply{}
	v, err := raftgroup.GetValue(txn, keyUsersVersion)
	if err != nil {
		return nil, err
	}
	if v != nil {
		out.Version = readU64(v)
	}
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefixUser, PrefetchValues: true})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		u := &shardkvpb.User{}
		if err := it.Item().Value(func(b []byte) error { return proto.Unmarshal(b, u) }); err != nil {
			return nil, err
		}
		out.Users = append(out.Users, u)
	}
	return out, nil
}

// applySetUsers applies a SetUsers entry: a refusal changes nothing, and
// the version moves only when a user changed.
func (sm *StateMachine) applySetUsers(b *batch, req *shardkvpb.SetUsersRequest) (Result, error) {
	if err := checkSetUsers(req); err != nil {
		return Result{Err: err}, nil
	}
	cur, err := readUsers(b.txn)
	if err != nil {
		return Result{}, err
	}
	next := map[string]*shardkvpb.User{}
	for _, u := range cur.Users {
		next[u.Name] = u
	}
	if req.GetReplaceManaged() {
		for n, u := range next {
			if u.Managed {
				delete(next, n)
			}
		}
	}
	for _, u := range req.GetSet() {
		next[u.Name] = &shardkvpb.User{Name: u.Name, Spec: u.Spec, Managed: u.Managed}
	}
	for _, n := range req.GetDelete() {
		delete(next, n)
	}
	if len(next) > MaxUsers {
		return Result{Err: refuse("set users: the cluster would have %d users, over the limit of %d", len(next), MaxUsers)}, nil
	}
	changed := false
	for _, u := range cur.Users {
		if n := next[u.Name]; n == nil {
			b.del(userKey(u.Name))
			changed = true
		}
	}
	names := make([]string, 0, len(next))
	for n := range next {
		names = append(names, n)
	}
	slices.Sort(names) // deterministic writes
	old := map[string]*shardkvpb.User{}
	for _, u := range cur.Users {
		old[u.Name] = u
	}
	out := &shardkvpb.UsersReply{Version: cur.Version}
	for _, n := range names {
		u := next[n]
		out.Users = append(out.Users, u)
		if o := old[n]; o != nil && proto.Equal(o, u) {
			continue
		}
		enc, err := proto.Marshal(u)
		if err != nil {
			return Result{}, err
		}
		b.set(userKey(n), enc)
		changed = true
	}
	if changed {
		out.Version++
		b.set(keyUsersVersion, u64(out.Version))
	}
	return Result{Users: out}, nil
}

// Users returns the users as this replica has applied them.
func (sm *StateMachine) Users() (*shardkvpb.UsersReply, error) {
	var out *shardkvpb.UsersReply
	err := sm.store.DB().View(func(txn *badger.Txn) error {
		var err error
		out, err = readUsers(txn)
		return err
	})
	return out, err
}

// Users answers from this replica after a read barrier, so a SetUsers
// that completed before is seen.
func (s *Server) Users(ctx context.Context, _ *shardkvpb.UsersRequest) (*shardkvpb.UsersReply, error) {
	if err := s.readIndex(ctx, false); err != nil {
		return nil, err
	}
	u, err := s.sm.Users()
	if err != nil {
		return nil, grpcErr(err)
	}
	return u, nil
}

// SetUsers logs the change and returns the users after it.
func (s *Server) SetUsers(ctx context.Context, req *shardkvpb.SetUsersRequest) (*shardkvpb.UsersReply, error) {
	if err := checkSetUsers(req); err != nil {
		return nil, grpcErr(err)
	}
	cmd := &shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_SetUsers{SetUsers: req}}
	if err := checkRequest(cmd); err != nil {
		return nil, grpcErr(err)
	}
	b, err := encodeCommand(cmd)
	if err != nil {
		return nil, err
	}
	v, err := s.r.Propose(ctx, b)
	if err != nil {
		return nil, grpcErr(err)
	}
	res, _ := v.(Result)
	if res.Err != nil {
		return nil, grpcErr(res.Err)
	}
	return res.Users, nil
}
