//go:build unix

package node

import "syscall"

// diskUsage is the size of the filesystem holding dir and the bytes
// available on it to an unprivileged user (statfs f_blocks, f_bavail).
func diskUsage(dir string) (size, avail uint64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	bs := uint64(st.Bsize)
	return uint64(st.Blocks) * bs, uint64(st.Bavail) * bs, nil
}
