package shardkvpb

import (
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

	errorDomain = "shardkv.io"
)

// Error builds a gRPC status error with a machine-readable reason.
func Error(c codes.Code, reason, msg string, meta map[string]string) error {
	st := status.New(c, msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: errorDomain, Metadata: meta}); err == nil {
		st = d
	}
	return st.Err()
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

// Retryable reports whether err proves the request was not executed, so it
// may be sent again (to the hinted leader, or after a backoff).
func Retryable(err error) bool {
	switch Reason(err) {
	case ReasonNotLeader, ReasonNotExecuted, ReasonWrongGroup, ReasonNotReady:
		return true
	}
	return false
}
