package lazyfs

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// TestMain runs the mmap helper when asked: a mapped file of a mount must
// be used from another process than the one serving it (see the package
// comment).
func TestMain(m *testing.M) {
	if os.Getenv("LAZYFS_TEST_MMAP") != "" {
		if err := mmapWrite(os.Getenv("LAZYFS_TEST_MMAP"), os.Getenv("LAZYFS_TEST_MSYNC") != ""); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// mmapWrite maps the first 8 KiB of path (made that size), writes a
// pattern through the mapping and, if sync, msyncs it.
func mmapWrite(path string, sync bool) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(8192); err != nil {
		return err
	}
	b, err := unix.Mmap(int(f.Fd()), 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	copy(b, bytes.Repeat([]byte("m"), 8192))
	if sync {
		if err := unix.Msync(b, unix.MS_SYNC); err != nil {
			return fmt.Errorf("msync: %w", err)
		}
	}
	return unix.Munmap(b)
}

// mountT mounts a lazy fs for a test; it fails the test (never skips)
// where FUSE cannot run.
func mountT(t *testing.T) (*FS, string, string) {
	t.Helper()
	if err := Check(); err != nil {
		t.Fatalf("lazyfs cannot run here: %v (CI installs fuse3 and runs as root)", err)
	}
	dir, backing := t.TempDir(), t.TempDir()
	f, err := Mount(dir, backing)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Unmount() })
	return f, dir, backing
}

func writeFile(t *testing.T, path string, data []byte, off int64, sync bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// powerCut cuts with keep and restarts.
func powerCut(t *testing.T, f *FS, keep float64) CutStats {
	t.Helper()
	cs, err := f.Cut(keep, rand.New(rand.NewPCG(1, 2)))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Restart(); err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestLazyFSForgetsUnsynced: data written and not fsynced is read back
// through the mount, lost at a power cut; fsynced data survives it.
func TestLazyFSForgetsUnsynced(t *testing.T) {
	f, dir, backing := mountT(t)
	synced, unsynced := filepath.Join(dir, "synced"), filepath.Join(dir, "unsynced")
	writeFile(t, synced, []byte("durable"), 0, true)
	writeFile(t, synced, []byte("DUR"), 0, false) // an overwrite, not synced
	writeFile(t, unsynced, bytes.Repeat([]byte("x"), 10000), 0, false)
	if got := readFile(t, synced); got != "DURable" {
		t.Fatalf("read through the mount: %q", got)
	}
	if got := readFile(t, filepath.Join(backing, "synced")); got != "durable" {
		t.Fatalf("backing before the cut: %q, want only what was fsynced", got)
	}
	if d := f.Stats().DirtyPages; d != 4 {
		t.Fatalf("dirty pages: %d, want 4", d)
	}
	cs := powerCut(t, f, 0)
	if cs.Files != 2 || cs.DroppedPage != 4 || cs.KeptPages != 0 {
		t.Fatalf("cut: %+v", cs)
	}
	if got := readFile(t, synced); got != "durable" {
		t.Fatalf("after the cut: %q, want the fsynced content", got)
	}
	// The file was created (names are durable at once), its data was not.
	if got := readFile(t, unsynced); got != "" {
		t.Fatalf("unsynced file after the cut: %d bytes, want 0", len(got))
	}
	// The restarted mount works: writes, fsync, read.
	writeFile(t, unsynced, []byte("again"), 0, true)
	if got := readFile(t, unsynced); got != "again" {
		t.Fatalf("after restart: %q", got)
	}
}

// TestLazyFSTruncate: size changes are lazy too, and a shrink then grow
// reads zeros, not the old bytes.
func TestLazyFSTruncate(t *testing.T) {
	f, dir, _ := mountT(t)
	p := filepath.Join(dir, "f")
	writeFile(t, p, []byte("0123456789"), 0, true)
	if err := os.Truncate(p, 4); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, 8); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, p); got != "0123\x00\x00\x00\x00" {
		t.Fatalf("shrink then grow: %q", got)
	}
	powerCut(t, f, 0)
	if got := readFile(t, p); got != "0123456789" {
		t.Fatalf("unsynced truncate survived the cut: %q", got)
	}
	fh, err := os.OpenFile(p, os.O_RDWR|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	fh.WriteString("ab")
	fh.Sync()
	fh.Close()
	powerCut(t, f, 0)
	if got := readFile(t, p); got != "ab" {
		t.Fatalf("fsynced O_TRUNC and write: %q", got)
	}
}

// TestLazyFSKeepsSomePages: with keep, a cut keeps that share of the
// unsynced pages, each whole, in any order: what the kernel wrote back.
func TestLazyFSKeepsSomePages(t *testing.T) {
	f, dir, _ := mountT(t)
	p := filepath.Join(dir, "f")
	writeFile(t, p, make([]byte, 64*pageSize), 0, true)
	data := bytes.Repeat([]byte("k"), 64*pageSize)
	writeFile(t, p, data, 0, false)
	cs := powerCut(t, f, 0.5)
	if cs.KeptPages == 0 || cs.DroppedPage == 0 || cs.KeptPages+cs.DroppedPage != 64 {
		t.Fatalf("cut: %+v, want some of 64 pages kept", cs)
	}
	got := readFile(t, p)
	kept := 0
	for i := 0; i < 64; i++ {
		pg := got[i*pageSize : (i+1)*pageSize]
		switch pg {
		case string(data[:pageSize]):
			kept++
		case string(make([]byte, pageSize)):
		default:
			t.Fatalf("page %d torn within: %q...", i, pg[:16])
		}
	}
	if kept != cs.KeptPages {
		t.Fatalf("%d pages kept on disk, cut says %d", kept, cs.KeptPages)
	}
}

// TestLazyFSFailSync: a failing fsync stores nothing and says so.
func TestLazyFSFailSync(t *testing.T) {
	f, dir, _ := mountT(t)
	p := filepath.Join(dir, "f")
	f.FailSync(1, syscall.EIO)
	fh, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	fh.WriteString("lost")
	if err := fh.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("fsync: %v, want EIO", err)
	}
	fh.Close()
	powerCut(t, f, 0)
	if got := readFile(t, p); got != "" {
		t.Fatalf("after a failed fsync and a cut: %q", got)
	}
	if s := f.Stats(); s.Fsyncs != 1 || s.Restarts != 1 {
		t.Fatalf("stats: %+v", s)
	}
}

// TestLazyFSMmap: writes through a shared mapping (badger's memtable
// logs) are durable after msync and lost without it.
func TestLazyFSMmap(t *testing.T) {
	f, dir, _ := mountT(t)
	for _, msync := range []bool{true, false} {
		p := filepath.Join(dir, fmt.Sprintf("mmap-%v", msync))
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "LAZYFS_TEST_MMAP="+p)
		if msync {
			cmd.Env = append(cmd.Env, "LAZYFS_TEST_MSYNC=1")
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("mmap helper: %v: %s", err, out)
		}
	}
	powerCut(t, f, 0)
	if got := readFile(t, filepath.Join(dir, "mmap-true")); got != string(bytes.Repeat([]byte("m"), 8192)) {
		t.Fatalf("msynced mapping after the cut: %d bytes %q...", len(got), got[:min(len(got), 16)])
	}
	// Never synced: not even its size (the truncate) survives.
	if got := readFile(t, filepath.Join(dir, "mmap-false")); got != "" {
		t.Fatalf("unsynced mapping after the cut: %d bytes", len(got))
	}
}

// TestLazyFSSizeDuringFsync: a size asked for while an fsync persists the
// file is the size readers see, never the backing file's size from before
// the fsync. The interleaving is made by hand: the backing stat that a
// getattr takes first, then an fsync, then the size fixed from the
// overlay. The stale size (0 here) made the kernel drop the pages of a
// mapped memtable past it, and badger died of SIGBUS.
func TestLazyFSSizeDuringFsync(t *testing.T) {
	f, dir, backing := mountT(t)
	p := filepath.Join(dir, "f")
	fh, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.Write(make([]byte, 2*pageSize)); err != nil {
		t.Fatal(err)
	}
	// The getattr's stat of the backing file, before the fsync.
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(backing, "f"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 0 {
		t.Fatalf("backing file before the fsync: %d bytes", st.Size)
	}
	if err := fh.Sync(); err != nil {
		t.Fatal(err)
	}
	var attr fuse.Attr
	attr.FromStat(&st)
	f.mu.Lock()
	m := f.m
	f.mu.Unlock()
	m.fixSize(filepath.Join(backing, "f"), &attr)
	if attr.Size != 2*pageSize {
		t.Fatalf("size answered after the fsync: %d, want %d", attr.Size, 2*pageSize)
	}
	if fi, err := os.Stat(p); err != nil || fi.Size() != 2*pageSize {
		t.Fatalf("stat through the mount: %v %v", fi.Size(), err)
	}
}

// TestLazyFSOverwriteKeepsSize: an fsynced overwrite inside a file's last,
// partial page does not grow the file to the page's end.
func TestLazyFSOverwriteKeepsSize(t *testing.T) {
	f, dir, _ := mountT(t)
	p := filepath.Join(dir, "f")
	writeFile(t, p, []byte("0123456789"), 0, true)
	writeFile(t, p, []byte("ab"), 0, true)
	if got := readFile(t, p); got != "ab23456789" {
		t.Fatalf("after the overwrite: %d bytes %q...", len(got), got[:min(len(got), 16)])
	}
	writeFile(t, p, []byte("cd"), 4, false)
	powerCut(t, f, 1) // the unsynced page kept: written back whole
	if got := readFile(t, p); got != "ab23cd6789" {
		t.Fatalf("after a cut that kept the page: %q (%d bytes)", got, len(got))
	}
}
