package lazyfs

import (
	"context"
	"path/filepath"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is a loopback node whose regular files' data goes through
// overlays.
type node struct {
	fs.LoopbackNode
	m *mount
}

var (
	_ fs.NodeLookuper    = (*node)(nil)
	_ fs.NodeWrapChilder = (*node)(nil)
	_ fs.NodeOpener      = (*node)(nil)
	_ fs.NodeCreater     = (*node)(nil)
	_ fs.NodeGetattrer   = (*node)(nil)
	_ fs.NodeSetattrer   = (*node)(nil)
	_ fs.NodeUnlinker    = (*node)(nil)
	_ fs.NodeRenamer     = (*node)(nil)
	_ fs.NodeFsyncer     = (*node)(nil)
)

func (n *node) backingPath() string {
	return filepath.Join(n.RootData.Path, n.Path(n.Root()))
}

// WrapChild makes the loopback's new nodes ours.
func (n *node) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	if ln, ok := ops.(*fs.LoopbackNode); ok {
		return &node{LoopbackNode: fs.LoopbackNode{RootData: ln.RootData}, m: n.m}
	}
	return ops
}

// Lookup answers with the size readers see: the kernel takes it as the
// file's.
func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ch, errno := n.LoopbackNode.Lookup(ctx, name, out)
	if errno == 0 {
		n.m.fixSize(filepath.Join(n.backingPath(), name), &out.Attr)
	}
	return ch, errno
}

// Open opens the backing file; O_TRUNC is recorded in the overlay, not
// done to the backing file.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	trunc := flags&syscall.O_TRUNC != 0
	flags &^= syscall.O_TRUNC | syscall.O_APPEND | syscall.O_DIRECT | fuse.FMODE_EXEC
	// Always read-write underneath: the overlay reads the backing file to
	// fill partial pages, and a Cut may write kept pages.
	fd, err := unix.Open(n.backingPath(), int(flags)&^(unix.O_WRONLY|unix.O_RDONLY)|unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, 0, fs.ToErrno(err)
	}
	f, errno := n.m.newFile(fd, trunc)
	if errno != 0 {
		return nil, 0, errno
	}
	return f, 0, 0
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	trunc := flags&syscall.O_TRUNC != 0
	ch, lf, _, errno := n.LoopbackNode.Create(ctx, name, flags&^syscall.O_TRUNC, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	// The loopback handle is replaced by ours, on a read-write fd.
	if r, ok := lf.(fs.FileReleaser); ok {
		r.Release(ctx)
	}
	fd, err := unix.Open(filepath.Join(n.backingPath(), name), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, 0, fs.ToErrno(err)
	}
	f, errno := n.m.newFile(fd, trunc)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	n.m.fixSize(filepath.Join(n.backingPath(), name), &out.Attr)
	return ch, f, 0, 0
}

func (n *node) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if f, ok := fh.(*file); ok {
		return f.Getattr(ctx, out)
	}
	if errno := n.LoopbackNode.Getattr(ctx, fh, out); errno != 0 {
		return errno
	}
	n.m.fixSize(n.backingPath(), &out.Attr)
	return 0
}

// fixSize sets a regular file's size in attr, filled from the stat of
// the backing file at path (its Ino is the backing inode), to the size
// readers see. That stat was taken before the overlay's lock: an fsync
// may have persisted the overlay since, grown the backing file and
// cleared the overlay's size, so a file with an overlay is stat'ed again
// under the lock. A stale, smaller size would make the kernel drop the
// pages past it, and a process with the file mapped (badger's memtables)
// then dies of SIGBUS (TestLazyFSSizeDuringFsync).
func (m *mount) fixSize(path string, attr *fuse.Attr) {
	if attr.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return
	}
	m.mu.Lock()
	o := m.overlays[attr.Ino]
	m.mu.Unlock()
	if o == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.sized {
		attr.Size = uint64(o.size)
		return
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err == nil && st.Ino == attr.Ino {
		attr.Size = uint64(st.Size)
	}
}

func (n *node) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if sz, ok := in.GetSize(); ok {
		f, _ := fh.(*file)
		if f == nil {
			fd, err := unix.Open(n.backingPath(), unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				return fs.ToErrno(err)
			}
			tmp, errno := n.m.newFile(fd, false)
			if errno != 0 {
				return errno
			}
			defer tmp.Release(ctx)
			f = tmp
		}
		if errno := f.truncate(int64(sz)); errno != 0 {
			return errno
		}
		in.Valid &^= fuse.FATTR_SIZE
	}
	if _, ok := fh.(*file); ok {
		fh = nil // the rest (modes, times) by path
	}
	if errno := n.LoopbackNode.Setattr(ctx, fh, in, out); errno != 0 {
		return errno
	}
	return n.Getattr(ctx, nil, out)
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	n.m.forget(filepath.Join(n.backingPath(), name))
	return n.LoopbackNode.Unlink(ctx, name)
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if np, ok := newParent.(*node); ok && flags&unix.RENAME_EXCHANGE == 0 {
		n.m.forget(filepath.Join(np.backingPath(), newName))
	}
	return n.LoopbackNode.Rename(ctx, name, newParent, newName, flags)
}

// Fsync makes a file's data durable; a directory's entries already are.
func (n *node) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	if errno := n.m.beforeSync(ctx, n.backingPath()); errno != 0 {
		return errno
	}
	if f, ok := fh.(*file); ok {
		return f.sync()
	}
	return 0
}

// newFile wraps fd, truncating the file in its overlay if trunc.
func (m *mount) newFile(fd int, trunc bool) (*file, syscall.Errno) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fs.ToErrno(err)
	}
	f := &file{m: m, fd: fd, ov: m.overlayOf(st.Ino)}
	if trunc {
		if errno := f.truncate(0); errno != 0 {
			unix.Close(fd)
			return nil, errno
		}
	}
	return f, 0
}

// file is an open regular file: data through its overlay.
type file struct {
	m  *mount
	fd int
	ov *overlay
}

var (
	_ fs.FileReader    = (*file)(nil)
	_ fs.FileWriter    = (*file)(nil)
	_ fs.FileGetattrer = (*file)(nil)
	_ fs.FileReleaser  = (*file)(nil)
	_ fs.FileFlusher   = (*file)(nil)
	_ fs.FileAllocater = (*file)(nil)
)

func (f *file) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	f.ov.mu.Lock()
	defer f.ov.mu.Unlock()
	n, err := f.ov.read(f.fd, dest, off)
	if err != nil {
		return nil, fs.ToErrno(err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (f *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if f.m.isCut() {
		return uint32(len(data)), 0 // the machine is off: nothing is stored
	}
	f.ov.mu.Lock()
	defer f.ov.mu.Unlock()
	if err := f.ov.write(f.fd, data, off); err != nil {
		return 0, fs.ToErrno(err)
	}
	return uint32(len(data)), 0
}

func (f *file) truncate(n int64) syscall.Errno {
	if f.m.isCut() {
		return 0
	}
	f.ov.mu.Lock()
	defer f.ov.mu.Unlock()
	return fs.ToErrno(f.ov.setSize(f.fd, n))
}

// Allocate only grows the size (unless KEEP_SIZE): space is not modelled.
func (f *file) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	if mode&unix.FALLOC_FL_KEEP_SIZE != 0 {
		return 0
	}
	if mode != 0 {
		return syscall.EOPNOTSUPP
	}
	f.ov.mu.Lock()
	cur, err := f.ov.fileSize(f.fd)
	f.ov.mu.Unlock()
	if err != nil {
		return fs.ToErrno(err)
	}
	if end := int64(off + size); end > cur {
		return f.truncate(end)
	}
	return 0
}

func (f *file) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	// The stat under the overlay's lock: not in the middle of an fsync's
	// truncates, nor stale after one (see fixSize).
	f.ov.mu.Lock()
	defer f.ov.mu.Unlock()
	var st syscall.Stat_t
	if err := syscall.Fstat(f.fd, &st); err != nil {
		return fs.ToErrno(err)
	}
	out.FromStat(&st)
	if f.ov.sized {
		out.Size = uint64(f.ov.size)
	}
	return 0
}

// sync persists the overlay: the file's fsync.
func (f *file) sync() syscall.Errno {
	f.m.mu.Lock()
	cut := f.m.cut
	f.m.mu.Unlock()
	if cut {
		return syscall.EIO
	}
	f.ov.mu.Lock()
	defer f.ov.mu.Unlock()
	_, err := f.ov.persist(f.fd, nil)
	return fs.ToErrno(err)
}

func (f *file) Flush(ctx context.Context) syscall.Errno { return 0 }

func (f *file) Release(ctx context.Context) syscall.Errno {
	return fs.ToErrno(unix.Close(f.fd))
}
