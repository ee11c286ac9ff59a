package shardkvpb

import (
	"errors"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error reasons carried in a google.rpc.ErrorInfo detail. Clients decide
// whether to retry from the reason alone, never from message text.
const (
	// ReasonNotLeader: the replica is not the leader; nothing was executed.
	// Metadata "leader_id" and "leader_addr" hint at the leader when known.
	ReasonNotLeader = "NOT_LEADER"
	// ReasonNotExecuted: the request was refused before it entered the log
	// (dropped proposal, leadership transfer, overload). Safe to retry.
	ReasonNotExecuted = "NOT_EXECUTED"
	// ReasonOutcomeUnknown: the request may or may not take effect (timeout,
	// or leadership lost after the entry was appended). Not safe to retry
	// blindly unless the request is idempotent.
	ReasonOutcomeUnknown = "OUTCOME_UNKNOWN"
	// ReasonTooLarge: the request exceeds a configured size limit.
	ReasonTooLarge = "TOO_LARGE"
	// ReasonInvalid: the request is malformed or refers to unknown things.
	ReasonInvalid = "INVALID"
	// ReasonWrongGroup: the group does not own the key's shard in its
	// current config; nothing was executed. Refresh the config and retry.
	// Metadata "config_num" is the group's config.
	ReasonWrongGroup = "WRONG_GROUP"
	// ReasonNotReady: the group owns the shard but it is still arriving;
	// nothing was executed. Retry after a short backoff.
	ReasonNotReady = "NOT_READY"
	// ReasonResultForgotten: the write's session no longer remembers the
	// result of this sequence number (the client had too many newer writes
	// on the shard unacknowledged): it may or may not have been applied.
	// Retrying with the same sequence number gets the same answer.
	ReasonResultForgotten = "RESULT_FORGOTTEN"
	// ReasonNotShardOwner (PermissionDenied): a group-to-group shard
	// transfer call names a caller that is not the shard's new owner in the
	// config it names; nothing was done.
	ReasonNotShardOwner = "NOT_SHARD_OWNER"
	// ReasonNotInstalled (FailedPrecondition): ShardInstalled was refused
	// because the new owner's own replicas, asked by the old owner, do not
	// confirm they hold the shard; the old copy is kept.
	ReasonNotInstalled = "NOT_INSTALLED"
	// ReasonNotAuthorized (PermissionDenied): with mutual TLS on, the
	// caller's certificate does not allow this call (docs/security.md);
	// nothing was done, and no replica will answer otherwise.
	ReasonNotAuthorized = "NOT_AUTHORIZED"

	errorDomain = "shardkv.io"
)

// Op errors, in WriteResult.error: the op was applied but its own semantics
// refused it (it changed nothing). Front ends render them in their
// protocol's words.
const (
	// OpErrNotInteger: INCR on a value that is not a canonical int64.
	OpErrNotInteger = "NOT_INTEGER"
	// OpErrOverflow: INCR would overflow int64.
	OpErrOverflow = "OVERFLOW"
	// OpErrNotFloat: INCR_FLOAT with an increment or on a value that is
	// not a float.
	OpErrNotFloat = "NOT_FLOAT"
	// OpErrNaN: INCR_FLOAT would produce NaN or an infinity.
	OpErrNaN = "NAN_OR_INFINITY"
	// OpErrValueTooLarge: the value the op would leave (APPEND's result)
	// exceeds the group's value limit.
	OpErrValueTooLarge = "VALUE_TOO_LARGE"
	// OpErrKeyTooLarge: the key, as stored, exceeds the storage's key limit
	// (an entry that reached the log without the check before proposing).
	OpErrKeyTooLarge = "KEY_TOO_LARGE"
	// OpErrCommandTooLarge: the command's writes together exceed what one
	// storage transaction holds; none of its ops ran.
	OpErrCommandTooLarge = "COMMAND_TOO_LARGE"
	// OpErrBadRecord: a stored record the op needed could not be decoded.
	OpErrBadRecord = "BAD_RECORD"
	// OpErrResultTooLarge: the op returns a previous value (a read made in
	// a write command, GETSET, GETDEL, SET ... GET), and the values the
	// command's ops return would together pass the per-command result
	// limit; the op changed nothing.
	OpErrResultTooLarge = "RESULT_TOO_LARGE"
	// OpErrNoSuchKey: RENAME of a key that does not exist.
	OpErrNoSuchKey = "NO_SUCH_KEY"
	// OpErrCrossShard: RENAME or COPY to a key in another shard.
	OpErrCrossShard = "CROSS_SHARD"
	// OpErrOffset: SET_RANGE at a negative offset.
	OpErrOffset = "OFFSET_OUT_OF_RANGE"
	// OpErrWrongType: the op is for another type than the key holds.
	OpErrWrongType = "WRONGTYPE"
	// OpErrInvalidOp: the op's fields do not fit together (an HSET with
	// fewer values than fields); front ends never send one.
	OpErrInvalidOp = "INVALID_OP"
)

// The two outcomes of a request that did not simply succeed or fail, as Go
// errors. They are defined once, here: the engine (pkg/raftgroup), the data
// groups (pkg/shardkv), the front ends and the clients wrap and test these
// same values, and each edge translates them once (to a gRPC status, to a
// Redis reply).
var (
	// ErrNotExecuted: the request did not run and never will, so it may be
	// sent again. Every more specific "not executed" error wraps it
	// (*Refusal does).
	ErrNotExecuted = errors.New("not executed")
	// ErrOutcomeUnknown: the request may or may not take effect (a
	// timeout, or leadership lost after the entry was appended). Resending
	// it may apply it twice.
	ErrOutcomeUnknown = errors.New("outcome unknown")
)

// Refusal is a request that was not executed and never will be, with the
// facts a client needs to resend it to the right place: which group owns
// the key's shard, who leads it, by which config. It says nothing of any
// client protocol; each edge renders it once: gRPC through GRPCStatus (a
// status with an ErrorInfo), Redis as MOVED/TRYAGAIN/CLUSTERDOWN
// (pkg/resp).
type Refusal struct {
	// Reason is ReasonNotLeader, ReasonWrongGroup, ReasonNotReady or
	// ReasonNotExecuted.
	Reason string
	Msg    string
	// Shard is the key's shard (-1: the refusal is not about one shard)
	// and ConfigNum the config the answer was decided by (the newest the
	// replica knows; 0: none yet).
	Shard     int
	ConfigNum uint64
	// Owner is the group to send the request to: for WRONG_GROUP the
	// shard's owner in ConfigNum (0: no group owns it, or no config yet);
	// for NOT_LEADER the replica's own group.
	Owner uint64
	// Leader is Owner's leader replica as last known (0: unknown), and
	// LeaderAddr its gRPC address when known.
	Leader     uint64
	LeaderAddr string
}

func (r *Refusal) Error() string { return r.Msg }

// Unwrap makes every refusal an ErrNotExecuted.
func (r *Refusal) Unwrap() error { return ErrNotExecuted }

// GRPCStatus renders the refusal for gRPC (grpc-go calls it for an error a
// handler returns). The metadata keep the names the clients parse:
// "leader_id"/"leader_addr" for NOT_LEADER (see LeaderHint), "config_num",
// "shard" and "owner_gid" for WRONG_GROUP and NOT_READY.
func (r *Refusal) GRPCStatus() *status.Status {
	meta := map[string]string{}
	c := codes.Unavailable
	switch r.Reason {
	case ReasonNotLeader:
		if r.Leader != 0 {
			meta["leader_id"] = strconv.FormatUint(r.Leader, 10)
			meta["leader_addr"] = r.LeaderAddr
		}
	case ReasonWrongGroup, ReasonNotReady:
		if r.Reason == ReasonWrongGroup {
			c = codes.FailedPrecondition
		}
		meta["config_num"] = strconv.FormatUint(r.ConfigNum, 10)
		meta["shard"] = strconv.Itoa(r.Shard)
		if r.Owner != 0 {
			meta["owner_gid"] = strconv.FormatUint(r.Owner, 10)
		}
		if r.Leader != 0 {
			meta["leader_id"] = strconv.FormatUint(r.Leader, 10)
			meta["leader_addr"] = r.LeaderAddr
		}
	}
	return newStatus(c, r.Reason, r.Msg, meta)
}

// Error builds a gRPC status error with a machine-readable reason.
func Error(c codes.Code, reason, msg string, meta map[string]string) error {
	return newStatus(c, reason, msg, meta).Err()
}

func newStatus(c codes.Code, reason, msg string, meta map[string]string) *status.Status {
	st := status.New(c, msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: errorDomain, Metadata: meta}); err == nil {
		st = d
	}
	return st
}

// NotLeaderError reports that the leader is elsewhere. leaderID 0 means unknown.
func NotLeaderError(msg string, leaderID uint64, leaderAddr string) error {
	meta := map[string]string{}
	if leaderID != 0 {
		meta["leader_id"] = strconv.FormatUint(leaderID, 10)
		meta["leader_addr"] = leaderAddr
	}
	return Error(codes.Unavailable, ReasonNotLeader, msg, meta)
}

// Info extracts the ErrorInfo of err, if it carries one.
func Info(err error) (*errdetails.ErrorInfo, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return nil, false
	}
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.Domain == errorDomain {
			return ei, true
		}
	}
	return nil, false
}

// Reason returns err's reason, or "" if it has none.
func Reason(err error) string {
	if ei, ok := Info(err); ok {
		return ei.Reason
	}
	return ""
}

// LeaderHint returns the leader named by a NOT_LEADER error, if any.
func LeaderHint(err error) (id uint64, addr string, ok bool) {
	ei, found := Info(err)
	if !found || ei.Reason != ReasonNotLeader {
		return 0, "", false
	}
	id, perr := strconv.ParseUint(ei.Metadata["leader_id"], 10, 64)
	if perr != nil || id == 0 {
		return 0, "", false
	}
	return id, ei.Metadata["leader_addr"], true
}

// OwnerHint is the owner group and its leader's address (when known) that
// a WRONG_GROUP refusal names; gid 0 if err names none.
func OwnerHint(err error) (gid uint64, leaderAddr string) {
	ei, found := Info(err)
	if !found || ei.Reason != ReasonWrongGroup {
		return 0, ""
	}
	gid, perr := strconv.ParseUint(ei.Metadata["owner_gid"], 10, 64)
	if perr != nil {
		return 0, ""
	}
	return gid, ei.Metadata["leader_addr"]
}

// Retryable reports whether err proves the request was not executed, so it
// may be sent again (to the hinted leader, or after a backoff).
func Retryable(err error) bool {
	switch Reason(err) {
	case ReasonNotLeader, ReasonNotExecuted, ReasonWrongGroup, ReasonNotReady:
		return true
	}
	return false
}

// Unauthorized reports whether err is a refusal of the caller's identity:
// retrying, or asking another replica, cannot help.
func Unauthorized(err error) bool { return Reason(err) == ReasonNotAuthorized }
