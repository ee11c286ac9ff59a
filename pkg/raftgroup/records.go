package raftgroup

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"
	"google.golang.org/protobuf/proto"
)

// Reading one record from the replica's badger DB, for the engine's own keys
// and for state machines: an absent key is not an error.

// readValue calls fn with the value under key (valid only during fn) and
// reports whether the key exists.
func readValue(txn *badger.Txn, key []byte, fn func(v []byte) error) (bool, error) {
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, item.Value(fn)
}

// GetValue returns a copy of the value under key; nil if the key is absent
// (or holds an empty value).
func GetValue(txn *badger.Txn, key []byte) ([]byte, error) {
	var out []byte
	_, err := readValue(txn, key, func(v []byte) error {
		out = append([]byte(nil), v...)
		return nil
	})
	return out, err
}

// GetProto unmarshals the value under key into m and reports whether the key
// exists; m is left untouched if it does not.
func GetProto(txn *badger.Txn, key []byte, m proto.Message) (bool, error) {
	return readValue(txn, key, func(v []byte) error { return proto.Unmarshal(v, m) })
}

// LoadApplied reads an applied index stored as 8 big-endian bytes under key;
// 0 if the key is absent (nothing applied yet).
func LoadApplied(txn *badger.Txn, key []byte) (uint64, error) {
	var idx uint64
	_, err := readValue(txn, key, func(v []byte) error {
		if len(v) != 8 {
			return fmt.Errorf("applied index under %q has %d bytes", key, len(v))
		}
		idx = binary.BigEndian.Uint64(v)
		return nil
	})
	return idx, err
}

// StoreApplied writes index under key in LoadApplied's format.
func StoreApplied(txn *badger.Txn, key []byte, index uint64) error {
	return txn.Set(key, binary.BigEndian.AppendUint64(nil, index))
}
