package lazyfs

import (
	"sort"
	"sync"

	"golang.org/x/sys/unix"
)

const pageSize = 4096

// overlay is what was written to one file and not yet fsynced: whole pages
// (each a full copy, zero past the end) and the file's size. The backing
// file holds what was fsynced, which is all a power cut leaves.
type overlay struct {
	mu    sync.Mutex
	pages map[int64][]byte
	// size is the file's size as written; minSize is the smallest size it
	// had since the last fsync (a shrink then grow reads zeros past it, not
	// the backing file's old bytes).
	size, minSize int64
	sized         bool // size and minSize are set (else the backing file's)
}

func newOverlay() *overlay { return &overlay{pages: map[int64][]byte{}} }

// dirty reports whether anything is unsynced.
func (o *overlay) dirty() bool { return len(o.pages) > 0 || o.sized }

// fileSize is the size readers see.
func (o *overlay) fileSize(fd int) (int64, error) {
	if o.sized {
		return o.size, nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, err
	}
	return st.Size, nil
}

// setSize records a truncate (or growth) without touching the backing file.
func (o *overlay) setSize(fd int, n int64) error {
	cur, err := o.fileSize(fd)
	if err != nil {
		return err
	}
	if !o.sized {
		o.minSize = cur
	}
	o.sized = true
	o.size = n
	o.minSize = min(o.minSize, n)
	if n < cur {
		// Drop whole pages past the end; zero the tail of the last one.
		for p := range o.pages {
			if p*pageSize >= n {
				delete(o.pages, p)
			}
		}
		if n%pageSize != 0 {
			pg, err := o.page(fd, n/pageSize)
			if err != nil {
				return err
			}
			clear(pg[n%pageSize:])
		}
	}
	return nil
}

// page returns page p for writing: the overlay's copy, or a new one read
// from the backing file (zeros past what is durable and valid).
func (o *overlay) page(fd int, p int64) ([]byte, error) {
	if pg, ok := o.pages[p]; ok {
		return pg, nil
	}
	pg := make([]byte, pageSize)
	if err := o.readBacking(fd, p, pg); err != nil {
		return nil, err
	}
	o.pages[p] = pg
	return pg, nil
}

// readBacking reads page p of what the file holds outside the overlay:
// the backing file's bytes below minSize, zeros past it.
func (o *overlay) readBacking(fd int, p int64, pg []byte) error {
	clear(pg)
	limit := int64(-1)
	if o.sized {
		limit = o.minSize
	}
	off := p * pageSize
	if limit >= 0 && off >= limit {
		return nil
	}
	n, err := unix.Pread(fd, pg, off)
	if err != nil {
		return err
	}
	if limit >= 0 && off+int64(n) > limit {
		clear(pg[limit-off:])
	}
	return nil
}

// write records data at off.
func (o *overlay) write(fd int, data []byte, off int64) error {
	size, err := o.fileSize(fd)
	if err != nil {
		return err
	}
	for done := 0; done < len(data); {
		at := off + int64(done)
		pg, err := o.page(fd, at/pageSize)
		if err != nil {
			return err
		}
		done += copy(pg[at%pageSize:], data[done:])
	}
	if end := off + int64(len(data)); end > size {
		if !o.sized {
			o.minSize = size
		}
		o.size, o.sized = end, true
	}
	return nil
}

// read fills dest from off, as the file is now; it returns the bytes read.
func (o *overlay) read(fd int, dest []byte, off int64) (int, error) {
	size, err := o.fileSize(fd)
	if err != nil {
		return 0, err
	}
	if off >= size {
		return 0, nil
	}
	dest = dest[:min(int64(len(dest)), size-off)]
	var buf [pageSize]byte
	for done := 0; done < len(dest); {
		at := off + int64(done)
		p := at / pageSize
		pg, ok := o.pages[p]
		if !ok {
			if err := o.readBacking(fd, p, buf[:]); err != nil {
				return done, err
			}
			pg = buf[:]
		}
		done += copy(dest[done:], pg[at%pageSize:])
	}
	return len(dest), nil
}

// persist writes the overlay to the backing file: what an fsync makes
// durable. With keep, only pages for which keep returns true are written
// and the size is not changed (a power cut with part of the dirty pages
// already written back by the kernel); the overlay is emptied either way.
// It returns the pages written.
func (o *overlay) persist(fd int, keep func() bool) (int, error) {
	ps := make([]int64, 0, len(o.pages))
	for p := range o.pages {
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	if keep == nil && o.sized {
		if err := unix.Ftruncate(fd, o.minSize); err != nil {
			return 0, err
		}
	}
	// A page is written up to the file's size, not whole: the last page
	// of a file whose size did not change (an overwrite) would otherwise
	// grow the file with zeros to a page boundary.
	size := o.size
	if !o.sized {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return 0, err
		}
		size = st.Size
	}
	written := 0
	for _, p := range ps {
		if keep != nil && !keep() {
			continue
		}
		pg := o.pages[p]
		n := min(int64(pageSize), size-p*pageSize)
		if n <= 0 {
			continue
		}
		if _, err := unix.Pwrite(fd, pg[:n], p*pageSize); err != nil {
			return written, err
		}
		written++
	}
	if keep == nil && o.sized {
		if err := unix.Ftruncate(fd, o.size); err != nil {
			return written, err
		}
	}
	clear(o.pages)
	o.sized = false
	return written, nil
}
