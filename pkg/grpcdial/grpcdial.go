// Package grpcdial is how every shardkv component dials a replica: the
// target form and the reconnect settings (this file), a connection pool
// keyed by address (Pool), and a leader-first caller of a group's replicas
// that follows NOT_LEADER hints and backs off between rounds (Caller).
//
// Replicas are named by stable DNS names (on Kubernetes, per-pod names of a
// StatefulSet) whose IP changes when a pod is replaced. gRPC's default "dns"
// resolver re-resolves a name at most every 30 s, so a client would keep
// dialing a dead IP for up to 30 s after a pod restart; and its default
// reconnect backoff grows to 120 s. Both are wrong for a handful of
// long-lived connections inside one cluster.
package grpcdial

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Target is the gRPC target for a "host:port" address. The passthrough
// scheme hands the address to the dialer as is, so every connection
// attempt resolves the host afresh.
func Target(addr string) string { return "passthrough:///" + addr }

// ConnectParams: reconnect within 2 s of a peer coming back, and give up
// on one connection attempt after 3 s (an IP that vanished answers nothing),
// so the caller can try another replica.
var connectParams = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
	MinConnectTimeout: 3 * time.Second,
}

// Reconnect is the dial option with those reconnect settings.
func Reconnect() grpc.DialOption { return grpc.WithConnectParams(connectParams) }

// MaxCallMessageBytes bounds one message a caller sends or receives. gRPC's
// default receive limit (4 MiB) is below the largest value (8 MiB by
// default, configurable higher): a Get of a large value would fail. Servers
// keep their own, tighter limits.
const MaxCallMessageBytes = 128 << 20

// Options are the default dial options: plaintext, fast reconnects, and
// messages as large as the largest value.
func Options() []grpc.DialOption { return OptionsWith(nil) }

// OptionsWith are Options with creds (mutual TLS: pkg/mtls) in place of
// plaintext; nil is plaintext.
func OptionsWith(creds credentials.TransportCredentials) []grpc.DialOption {
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(creds), Reconnect(),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxCallMessageBytes), grpc.MaxCallSendMsgSize(MaxCallMessageBytes))}
}
