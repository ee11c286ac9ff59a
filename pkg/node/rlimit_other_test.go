//go:build !linux

package node_test

import "errors"

func limitAddressSpace(pid int, n uint64) error {
	return errors.New("prlimit needs Linux")
}
