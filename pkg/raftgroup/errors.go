package raftgroup

import (
	"errors"
	"fmt"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The engine's errors wrap the two sentinels of the one error vocabulary,
// shardkvpb.ErrNotExecuted (the command did not enter the log and never
// will: safe to retry; every more specific "not executed" error wraps it)
// and shardkvpb.ErrOutcomeUnknown (the command may still commit: a timeout,
// or leadership lost after the entry was appended; retrying may apply it
// twice). Test them with IsNotExecuted and IsOutcomeUnknown.

// ErrStopped: the replica is shut down.
var ErrStopped = errors.New("replica stopped")

// NotLeaderError is returned by calls that must reach the leader. Leader is 0
// when no leader is known. It wraps ErrNotExecuted.
type NotLeaderError struct {
	Leader uint64
	Addr   string
}

func (e *NotLeaderError) Error() string {
	if e.Leader == 0 {
		return "not the leader, and no leader is known (election in progress?)"
	}
	return fmt.Sprintf("not the leader; leader is replica %d at %s", e.Leader, e.Addr)
}

func (e *NotLeaderError) Unwrap() error { return shardkvpb.ErrNotExecuted }

func notExecuted(format string, a ...any) error {
	return fmt.Errorf("%w: %s", shardkvpb.ErrNotExecuted, fmt.Sprintf(format, a...))
}

func outcomeUnknown(format string, a ...any) error {
	return fmt.Errorf("%w: %s", shardkvpb.ErrOutcomeUnknown, fmt.Sprintf(format, a...))
}

// errTooLarge marks size-limit refusals; they are also not executed.
var errTooLarge = errors.New("too large")

// GRPCError converts an engine error into a gRPC status error whose reason
// tells clients whether a retry is safe. Servers built on the engine use it.
// An error that already renders itself for gRPC (a status, a
// *shardkvpb.Refusal) is returned as is.
func GRPCError(err error) error {
	if err == nil {
		return nil
	}
	var st interface{ GRPCStatus() *status.Status }
	var nl *NotLeaderError
	switch {
	case errors.As(err, &st):
		return err
	case errors.As(err, &nl):
		return shardkvpb.NotLeaderError(err.Error(), nl.Leader, nl.Addr)
	case errors.Is(err, errTooLarge):
		return shardkvpb.Error(codes.ResourceExhausted, shardkvpb.ReasonTooLarge, err.Error(), nil)
	case errors.Is(err, shardkvpb.ErrNotExecuted):
		return shardkvpb.Error(codes.Unavailable, shardkvpb.ReasonNotExecuted, err.Error(), nil)
	case errors.Is(err, shardkvpb.ErrOutcomeUnknown):
		return shardkvpb.Error(codes.Unknown, shardkvpb.ReasonOutcomeUnknown, err.Error(), nil)
	case errors.Is(err, ErrStopped):
		return shardkvpb.Error(codes.Unavailable, shardkvpb.ReasonNotExecuted, err.Error(), nil)
	}
	return shardkvpb.Error(codes.FailedPrecondition, shardkvpb.ReasonInvalid, err.Error(), nil)
}

// IsNotExecuted reports whether err proves the command did not and will not
// execute, so it is safe to retry.
func IsNotExecuted(err error) bool { return errors.Is(err, shardkvpb.ErrNotExecuted) }

// IsOutcomeUnknown reports whether the command may or may not take effect.
func IsOutcomeUnknown(err error) bool { return errors.Is(err, shardkvpb.ErrOutcomeUnknown) }

// IsTooLarge reports whether err refused a command for its size (it was not
// executed, and retrying it unchanged cannot succeed).
func IsTooLarge(err error) bool { return errors.Is(err, errTooLarge) }
