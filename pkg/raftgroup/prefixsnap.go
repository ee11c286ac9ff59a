package raftgroup

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/dgraph-io/badger/v4"
)

// Snapshots of state machines that keep all their state in the replica's
// badger DB under a few key prefixes, with their applied index stored under
// one key (see LoadApplied): they snapshot and restore by prefix instead of
// writing their own stream format. PrefixStore wraps these for them.

// maxSnapshotRecord bounds one key or value in a snapshot stream, so a
// corrupt stream fails instead of allocating without limit.
const maxSnapshotRecord = 64 << 20

// PrefixSnapshot returns a point-in-time Snapshot of every key under
// prefixes, read from one badger read transaction. Its index is the value
// stored under appliedKey (0 if absent).
func PrefixSnapshot(db *badger.DB, appliedKey []byte, prefixes ...[]byte) (Snapshot, error) {
	txn := db.NewTransaction(false)
	idx, err := LoadApplied(txn, appliedKey)
	if err != nil {
		txn.Discard()
		return nil, err
	}
	return &prefixSnap{txn: txn, index: idx, prefixes: prefixes}, nil
}

type prefixSnap struct {
	txn      *badger.Txn
	index    uint64
	prefixes [][]byte
}

func (s *prefixSnap) Index() uint64 { return s.index }
func (s *prefixSnap) Close()        { s.txn.Discard() }

// WriteTo streams every key and value as (uvarint length, bytes) pairs.
func (s *prefixSnap) WriteTo(w io.Writer) (int64, error) {
	bw := bufio.NewWriterSize(w, 256<<10)
	var n int64
	put := func(b []byte) error {
		hdr := binary.AppendUvarint(nil, uint64(len(b)))
		if _, err := bw.Write(hdr); err != nil {
			return err
		}
		_, err := bw.Write(b)
		n += int64(len(hdr) + len(b))
		return err
	}
	for _, p := range s.prefixes {
		it := s.txn.NewIterator(badger.IteratorOptions{Prefix: p, PrefetchValues: true})
		for it.Rewind(); it.Valid(); it.Next() {
			v, err := it.Item().ValueCopy(nil)
			if err == nil {
				err = put(it.Item().Key())
			}
			if err == nil {
				err = put(v)
			}
			if err != nil {
				it.Close()
				return n, err
			}
		}
		it.Close()
	}
	return n, bw.Flush()
}

// RestorePrefixes deletes every key under prefixes, then writes the pairs
// read from r (as written by a PrefixSnapshot), streaming.
func RestorePrefixes(db *badger.DB, r io.Reader, prefixes ...[]byte) error {
	for _, p := range prefixes {
		if err := db.DropPrefix(p); err != nil {
			return err
		}
	}
	br := bufio.NewReaderSize(r, 256<<10)
	read := func() ([]byte, error) {
		l, err := binary.ReadUvarint(br)
		if err != nil {
			return nil, err
		}
		if l > maxSnapshotRecord {
			return nil, fmt.Errorf("snapshot record of %d bytes", l)
		}
		b := make([]byte, l)
		_, err = io.ReadFull(br, b)
		return b, err
	}
	wb := db.NewWriteBatch()
	defer wb.Cancel()
	for {
		k, err := read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		v, err := read()
		if err != nil {
			return fmt.Errorf("snapshot: truncated record: %w", err)
		}
		if err := wb.Set(k, v); err != nil {
			return err
		}
	}
	return wb.Flush()
}
