//go:build !linux

package resp

import (
	"syscall"
	"time"
)

// stampArrivals: only Linux stamps arrivals here; elsewhere commands are
// ordered by when they were read.
func stampArrivals(any) syscall.RawConn { return nil }

func readStamped(syscall.RawConn, []byte) (int, time.Time, error) {
	panic("resp: readStamped without stampArrivals")
}
