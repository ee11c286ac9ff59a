package node_test

import (
	"syscall"
	"unsafe"
)

// limitAddressSpace lowers process pid's RLIMIT_AS to n bytes (prlimit(2)),
// so that an allocation past it fails inside that process only, as a
// container's memory limit would stop it, without pressing on the machine.
func limitAddressSpace(pid int, n uint64) error {
	lim := syscall.Rlimit{Cur: n, Max: n}
	_, _, errno := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), syscall.RLIMIT_AS,
		uintptr(unsafe.Pointer(&lim)), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}
