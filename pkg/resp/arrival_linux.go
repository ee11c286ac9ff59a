package resp

import (
	"encoding/binary"
	"io"
	"syscall"
	"time"
)

// stampArrivals asks the kernel to stamp the bytes a socket (a client's
// connection, or a listener, whose clients then inherit it) receives with
// their arrival time (SO_TIMESTAMPNS), so that the order of commands from
// different connections is the order they reached the host, not the order
// their goroutines happened to run (see blockQueue.add). The kernel turns
// stamping on for the host a moment after the first socket asks, so the
// server asks on its listener before any client comes. nil when sock is
// not a socket that can.
func stampArrivals(sock any) syscall.RawConn {
	sc, ok := sock.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1)
	}); err != nil || serr != nil {
		return nil
	}
	return rc
}

// readStamped reads into p from rc (which honours nc's read deadline), and
// returns the kernel's arrival time of the bytes read (zero if it gave
// none).
func readStamped(rc syscall.RawConn, p []byte) (int, time.Time, error) {
	var (
		n    int
		at   time.Time
		rerr error
		oob  [64]byte
	)
	err := rc.Read(func(fd uintptr) bool {
		for {
			var oobn int
			n, oobn, _, _, rerr = syscall.Recvmsg(int(fd), p, oob[:], 0)
			switch rerr {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // wait for input (or the deadline)
			case nil:
				at = arrivalStamp(oob[:oobn])
			}
			return true
		}
	})
	switch {
	case err != nil:
		return 0, at, err
	case rerr != nil:
		return 0, at, rerr
	case n == 0 && len(p) > 0:
		return 0, at, io.EOF
	}
	return n, at, nil
}

// arrivalStamp finds SCM_TIMESTAMPNS in a control message.
func arrivalStamp(oob []byte) time.Time {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return time.Time{}
	}
	for _, m := range msgs {
		if m.Header.Level == syscall.SOL_SOCKET && m.Header.Type == syscall.SCM_TIMESTAMPNS && len(m.Data) >= 16 {
			sec := int64(binary.NativeEndian.Uint64(m.Data[0:8]))
			nsec := int64(binary.NativeEndian.Uint64(m.Data[8:16]))
			return time.Unix(sec, nsec)
		}
	}
	return time.Time{}
}
