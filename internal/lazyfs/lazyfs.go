// Package lazyfs is a FUSE filesystem for tests that forgets what was not
// fsynced, as a disk does on a power cut (after etcd's use of LazyFS).
//
// A mount passes through to a backing directory, except that file data
// written and not yet fsynced stays in memory: readers through the mount
// see it, the backing directory does not. Cut simulates the power cut:
// every unsynced page is dropped, or kept with a probability (the kernel
// had written it back), and the mount stops storing anything until
// Restart mounts it again, on what the backing directory holds, with an
// empty page cache, as a rebooted machine sees its disk. Fsync can also be
// made to fail or be slow.
//
// Namespace operations (create, rename, unlink, mkdir) reach the backing
// directory at once, as LazyFS does; only file data and sizes are lazy.
//
// Processes using a mount must be other processes than the one serving
// it: a page fault on a mapped file of the mount waits for the server,
// and a Go server in the same process can be stopped by the garbage
// collector waiting for that very thread.
package lazyfs

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// FS is one lazy mount of a backing directory.
type FS struct {
	dir, backing string

	mu       sync.Mutex
	m        *mount
	syncErr  syscall.Errno // fsyncs fail with it while set
	failN    int           // ... for this many more fsyncs (-1: all)
	failOf   string        // base-name pattern the failures apply to ("": all)
	delay    time.Duration
	delayOf  string // base-name pattern the delay applies to ("": all)
	fsyncs   int64
	restarts int
}

// mount is one FUSE mount of FS: it ends at a Cut or Unmount.
type mount struct {
	fs     *FS
	server *fuse.Server
	root   string

	mu       sync.Mutex
	cut      bool // a power cut happened: store nothing more
	overlays map[uint64]*overlay
	cutDone  chan struct{} // closed at the cut: fsyncs waiting give up
}

// Check reports why lazyfs cannot run here, or nil.
func Check() error {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("lazyfs: no /dev/fuse (the kernel's FUSE device): %w", err)
	}
	if os.Geteuid() != 0 {
		if _, err := exec.LookPath("fusermount3"); err != nil {
			if _, err := exec.LookPath("fusermount"); err != nil {
				return errors.New("lazyfs: neither root nor fusermount3 (Debian package fuse3) available to mount")
			}
		}
	}
	return nil
}

// Mount mounts backing at dir (both must exist).
func Mount(dir, backing string) (*FS, error) {
	if err := Check(); err != nil {
		return nil, err
	}
	f := &FS{dir: dir, backing: backing}
	if err := f.mount(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *FS) mount() error {
	var st syscall.Stat_t
	if err := syscall.Stat(f.backing, &st); err != nil {
		return fmt.Errorf("lazyfs: backing dir: %w", err)
	}
	m := &mount{fs: f, root: f.backing, overlays: map[uint64]*overlay{}, cutDone: make(chan struct{})}
	lr := &fs.LoopbackRoot{Path: f.backing, Dev: uint64(st.Dev)}
	root := &node{LoopbackNode: fs.LoopbackNode{RootData: lr}, m: m}
	lr.RootNode = root
	zero := time.Duration(0)
	opts := &fs.Options{
		// No kernel caching of names or attributes: after a Restart the
		// kernel must ask again.
		EntryTimeout: &zero, AttrTimeout: &zero, NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{
			FsName: "lazyfs", Name: "lazyfs", AllowOther: os.Geteuid() == 0,
			DirectMount: os.Geteuid() == 0, MaxWrite: 1 << 20,
			// Listings would carry the backing files' sizes, which the
			// kernel takes as the files' sizes (a mapped file shorter
			// than its mapping faults with SIGBUS).
			DisableReadDirPlus: true, DisableXAttrs: true,
			Debug: os.Getenv("LAZYFS_DEBUG") != "", // every FUSE operation, on stderr
		},
	}
	srv, err := fs.Mount(f.dir, root, opts)
	if err != nil {
		return fmt.Errorf("lazyfs: mount %s: %w", f.dir, err)
	}
	m.server = srv
	f.mu.Lock()
	f.m = m
	f.mu.Unlock()
	return nil
}

// CutStats says what a Cut dropped and kept.
type CutStats struct {
	Files       int // files with unsynced data
	DroppedPage int
	KeptPages   int
}

// Cut is a power cut: every page written and not fsynced since is lost,
// except that each is kept with probability keep (written back by the
// kernel before the cut, in any order). Unsynced size changes are lost.
// From then on the mount stores nothing and fsyncs fail; the processes
// using it should be killed, then Restart called.
func (f *FS) Cut(keep float64, rng *rand.Rand) (CutStats, error) {
	f.mu.Lock()
	m := f.m
	f.mu.Unlock()
	var cs CutStats
	if m == nil {
		return cs, errors.New("lazyfs: not mounted")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cut {
		return cs, nil
	}
	m.cut = true
	close(m.cutDone)
	var paths map[uint64]string // backing paths by inode, walked once if pages are kept
	if keep > 0 {
		paths = inodePaths(m.root)
	}
	var firstErr error
	for ino, o := range m.overlays {
		o.mu.Lock()
		if o.dirty() {
			cs.Files++
			kept := 0
			if p, ok := paths[ino]; ok && len(o.pages) > 0 {
				fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0)
				if err == nil {
					n := len(o.pages)
					kept, err = o.persist(fd, func() bool { return rng.Float64() < keep })
					cs.DroppedPage += n - kept
					unix.Close(fd)
				}
				if err != nil && firstErr == nil {
					firstErr = err
				}
			} else {
				cs.DroppedPage += len(o.pages)
			}
			cs.KeptPages += kept
		}
		clear(o.pages)
		o.sized = false
		o.mu.Unlock()
	}
	return cs, firstErr
}

// Restart unmounts (detaching, whatever still holds it) and mounts the
// backing directory again, as a machine sees its disk after a reboot.
func (f *FS) Restart() error {
	if err := f.unmount(); err != nil {
		return err
	}
	f.mu.Lock()
	f.restarts++
	f.mu.Unlock()
	return f.mount()
}

// Unmount ends the mount; unsynced data is lost.
func (f *FS) Unmount() error { return f.unmount() }

func (f *FS) unmount() error {
	f.mu.Lock()
	m := f.m
	f.m = nil
	f.mu.Unlock()
	if m == nil {
		return nil
	}
	m.mu.Lock()
	if !m.cut {
		m.cut = true
		close(m.cutDone)
	}
	m.mu.Unlock()
	// A lazy unmount cannot fail on a busy mount; the server then exits.
	if err := unix.Unmount(f.dir, unix.MNT_DETACH); err != nil && os.Geteuid() == 0 {
		return fmt.Errorf("lazyfs: unmount %s: %w", f.dir, err)
	} else if err != nil {
		if out, err := exec.Command("fusermount3", "-u", "-z", f.dir).CombinedOutput(); err != nil {
			return fmt.Errorf("lazyfs: fusermount3 -u -z %s: %v: %s", f.dir, err, out)
		}
	}
	done := make(chan struct{})
	go func() { m.server.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("lazyfs: the server of %s did not stop within 10s of unmounting", f.dir)
	}
	return nil
}

// FailSync makes the next n fsyncs (n < 0: all, until FailSync(0, 0))
// fail with errno, storing nothing.
func (f *FS) FailSync(n int, errno syscall.Errno) {
	_ = f.FailSyncOf("", n, errno)
}

// FailSyncOf is FailSync for the files whose base name matches pattern
// (filepath.Match; "" matches every file and directory): one kind of file
// failing, as a disk's bad sector under one file does.
func (f *FS) FailSyncOf(pattern string, n int, errno syscall.Errno) error {
	if _, err := filepath.Match(pattern, ""); err != nil {
		return fmt.Errorf("lazyfs: fail pattern %q: %w", pattern, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failN, f.syncErr, f.failOf = n, errno, pattern
	return nil
}

// DelaySync makes every fsync of a file whose base name matches pattern
// (filepath.Match; "" matches every file and directory) take d longer: a
// slow disk, or one slow kind of file (badger's tables: "*.sst") to hold
// a window open.
func (f *FS) DelaySync(pattern string, d time.Duration) error {
	if _, err := filepath.Match(pattern, ""); err != nil {
		return fmt.Errorf("lazyfs: delay pattern %q: %w", pattern, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.delay, f.delayOf = d, pattern
	return nil
}

// Stats reports counters since Mount.
type Stats struct {
	Fsyncs   int64
	Restarts int
	// DirtyPages is what a Cut now would lose (with keep 0).
	DirtyPages int
}

func (f *FS) Stats() Stats {
	f.mu.Lock()
	s := Stats{Fsyncs: f.fsyncs, Restarts: f.restarts}
	m := f.m
	f.mu.Unlock()
	if m != nil {
		m.mu.Lock()
		for _, o := range m.overlays {
			o.mu.Lock()
			s.DirtyPages += len(o.pages)
			o.mu.Unlock()
		}
		m.mu.Unlock()
	}
	return s
}

// beforeSync applies the fsync faults to the file or directory at path;
// it returns the errno to answer.
func (m *mount) beforeSync(ctx context.Context, path string) syscall.Errno {
	f := m.fs
	f.mu.Lock()
	f.fsyncs++
	delay := f.delay
	if ok, _ := filepath.Match(f.delayOf, filepath.Base(path)); f.delayOf != "" && !ok {
		delay = 0
	}
	var errno syscall.Errno
	if ok, _ := filepath.Match(f.failOf, filepath.Base(path)); f.failN != 0 && (f.failOf == "" || ok) {
		errno = f.syncErr
		if f.failN > 0 {
			f.failN--
		}
	}
	f.mu.Unlock()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-m.cutDone:
		case <-ctx.Done():
		}
	}
	if m.isCut() {
		return syscall.EIO
	}
	return errno
}

func (m *mount) isCut() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cut
}

// overlayOf returns the overlay of backing inode ino, made if needed.
func (m *mount) overlayOf(ino uint64) *overlay {
	m.mu.Lock()
	defer m.mu.Unlock()
	o := m.overlays[ino]
	if o == nil {
		o = newOverlay()
		m.overlays[ino] = o
	}
	return o
}

// forget drops the overlay of a backing file about to lose its last name
// (its inode number may be reused).
func (m *mount) forget(path string) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil || st.Nlink > 1 || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return
	}
	m.mu.Lock()
	delete(m.overlays, st.Ino)
	m.mu.Unlock()
}

// inodePaths maps the regular files of the backing tree by inode.
func inodePaths(root string) map[uint64]string {
	paths := map[uint64]string{}
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) == nil {
			paths[st.Ino] = p
		}
		return nil
	})
	return paths
}
