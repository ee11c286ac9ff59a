// Package durable writes files and directories so that they survive a
// power cut: data fsynced, and the directory entries naming them too.
package durable

import (
	"os"
	"path/filepath"
)

// WriteFile writes a file that must survive a power cut whole or
// not at all: a temp file in the same directory, fsynced, renamed over
// path, then the directory fsynced. os.WriteFile left a node's identity
// file empty or partial after a power cut (pkg/node's TestPowerCutIdentity).
func WriteFile(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op once renamed
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return SyncDir(dir)
}

// MkdirAll is os.MkdirAll that also fsyncs the parent of every
// directory it created, so that the directory survives a power cut.
func MkdirAll(dir string, perm os.FileMode) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	var created []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil || d == filepath.Dir(d) {
			break
		}
		created = append(created, d)
	}
	if err := os.MkdirAll(dir, perm); err != nil {
		return err
	}
	for _, d := range created {
		if err := SyncDir(filepath.Dir(d)); err != nil {
			return err
		}
	}
	return nil
}

// SyncDir fsyncs a directory, making the names in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
