package resp

import (
	"bytes"
	"time"
)

// A burst is the commands a connection receives from idle to idle: for a
// client that waits for its replies before sending more (every pipelining
// client), one pipeline or the start of one.
//
// go-redis resends a whole pipeline when the reply to its first command is
// a retry error (TRYAGAIN, CLUSTERDOWN, LOADING, ...), commands that did run
// included. So the first command of a burst runs alone, and when it is
// refused that way, every keyed command read within PipelineTimeout of it
// is refused too (not executed): the resent pipeline then applies each
// write once. A resend that arrives later starts a new burst.
type burst struct {
	refuseUntil time.Time // keyed commands whose deadline is before it are refused
}

// refuses reports whether a keyed command with this deadline is refused.
func (b *burst) refuses(deadline time.Time) bool { return deadline.Before(b.refuseUntil) }

// errEarlierRefused is the reply to a command refused because the first
// command of its pipeline was.
const errEarlierRefused = "TRYAGAIN not executed: the first command of this pipeline was refused; resend the pipeline"

// retryPrefixes are the errors that clients resend on their own (go-redis's
// shouldRetry). A reply starting with one of them must mean "not executed".
var retryPrefixes = [][]byte{
	[]byte("-TRYAGAIN"), []byte("-CLUSTERDOWN"), []byte("-LOADING"), []byte("-READONLY"),
	[]byte("-MASTERDOWN"), []byte("-NOREPLICAS"), []byte("-ERR max number of clients reached"),
}

// retryable reports whether reply is an error that clients resend.
func retryable(reply []byte) bool {
	for _, p := range retryPrefixes {
		if bytes.HasPrefix(reply, p) {
			return true
		}
	}
	return false
}
