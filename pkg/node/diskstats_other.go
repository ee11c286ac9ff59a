//go:build !unix

package node

import "errors"

// diskUsage is not measured here: the disk metrics are left out.
func diskUsage(string) (size, avail uint64, err error) {
	return 0, 0, errors.New("disk usage: not supported on this platform")
}
