package client

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

var (
	rpcPrefix = regexp.MustCompile(`rpc error: code = \w+ desc = `)
	dialError = regexp.MustCompile(`connection error: desc = "transport: (?:Error while dialing: )?([^"]*)"`)
)

// ErrorLine renders an error of the clients as one readable line: gRPC's
// wrappers are dropped, and a controller's refusal says so.
func ErrorLine(err error) string {
	s := CleanErrorText(err.Error())
	if ctrlerclient.IsRefused(err) && !strings.Contains(s, "refused") && !strings.Contains(s, "(last error") {
		s = "refused: " + s
	}
	return s
}

// CleanErrorText drops gRPC's wrappers from an error text and keeps it on
// one line.
func CleanErrorText(s string) string {
	s = dialError.ReplaceAllString(s, "$1")
	s = rpcPrefix.ReplaceAllString(s, "")
	return strings.ReplaceAll(s, "\n", "; ")
}

// OpError is a write that the group applied as a refusal: it changed
// nothing (an APPEND whose result would pass the value limit, a key too
// long to store). Code is one of shardkvpb's OpErr codes.
type OpError struct {
	Key  string
	Code string
}

// Is makes a WRONGTYPE refusal match ErrWrongType.
func (e *OpError) Is(target error) bool {
	return target == ErrWrongType && e.Code == shardkvpb.OpErrWrongType
}

func (e *OpError) Error() string {
	return fmt.Sprintf("key %q: the write was refused: %s", e.Key, e.Code)
}

// opResult turns a write's result into an error when the group refused it.
func opResult(key []byte, r *shardkvpb.WriteResult) error {
	if r.GetError() != "" {
		return &OpError{Key: string(key), Code: r.GetError()}
	}
	return nil
}
