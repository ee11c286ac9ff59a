package client

import (
	"regexp"
	"strings"

	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
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
