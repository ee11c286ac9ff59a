package main

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// testOptions builds shardkv-like image from two small files in dir.
func testOptions(t *testing.T, dir, out string) options {
	t.Helper()
	for _, f := range []string{"manager", "node"} {
		// 0600 on disk: the image must say 0755 anyway.
		if err := os.WriteFile(filepath.Join(dir, f), []byte("#!/bin/true "+f+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return options{
		Tag:     "shardkv:test",
		Out:     out,
		User:    "65532:65532",
		Cmd:     []string{"/manager"},
		Files:   []string{filepath.Join(dir, "manager") + "=/manager", filepath.Join(dir, "node") + "=/bin/node"},
		Created: time.Unix(0, 0).UTC(),
	}
}

func TestBuild(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "a.tar")
	o := testOptions(t, dir, out)
	res, err := build(o)
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("shardkv:test")
	img, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := img.Digest(); d != res.Digest {
		t.Errorf("digest read back %v, build said %v", d, res.Digest)
	}
	if id, _ := img.ConfigName(); id != res.ID {
		t.Errorf("ID read back %v, build said %v", id, res.ID)
	}

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("platform %s/%s, want linux/amd64", cf.OS, cf.Architecture)
	}
	if !cf.Created.Time.Equal(time.Unix(0, 0)) {
		t.Errorf("created %v, want the epoch", cf.Created)
	}
	c := cf.Config
	if c.User != "65532:65532" {
		t.Errorf("User %q", c.User)
	}
	if !reflect.DeepEqual(c.Cmd, []string{"/manager"}) || c.Entrypoint != nil {
		t.Errorf("Cmd %q Entrypoint %q, want [/manager] and none", c.Cmd, c.Entrypoint)
	}
	if c.WorkingDir != "/" || !reflect.DeepEqual(c.Env, []string{defaultPath}) {
		t.Errorf("WorkingDir %q Env %q", c.WorkingDir, c.Env)
	}

	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	type file struct {
		typ      byte
		mode     int64
		uid, gid int
		content  string
	}
	got := map[string]file{}
	var order []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got[h.Name] = file{h.Typeflag, h.Mode, h.Uid, h.Gid, string(b)}
		order = append(order, h.Name)
		if !h.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("%s: mtime %v, want the epoch", h.Name, h.ModTime)
		}
	}
	want := map[string]file{
		"bin/":     {tar.TypeDir, 0o755, 0, 0, ""},
		"bin/node": {tar.TypeReg, 0o755, 0, 0, "#!/bin/true node\n"},
		"manager":  {tar.TypeReg, 0o755, 0, 0, "#!/bin/true manager\n"},
		"tmp/":     {tar.TypeDir, 0o1777, 0, 0, ""},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("layer:\n got %+v\nwant %+v", got, want)
	}
	if strings.Join(order, " ") != "bin/ bin/node manager tmp/" {
		t.Errorf("layer order %q, want sorted", order)
	}
}

func TestReproducible(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(t, dir, filepath.Join(dir, "a.tar"))
	a, err := build(o)
	if err != nil {
		t.Fatal(err)
	}
	// Same contents, other on-disk mtimes and modes: same image.
	later := time.Now().Add(time.Hour)
	for _, f := range []string{"manager", "node"} {
		p := filepath.Join(dir, f)
		if err := os.Chtimes(p, later, later); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	o.Out = filepath.Join(dir, "b.tar")
	b, err := build(o)
	if err != nil {
		t.Fatal(err)
	}
	if a.Digest != b.Digest || a.ID != b.ID {
		t.Errorf("two builds of the same inputs: %v and %v", a.Digest, b.Digest)
	}
	ab, _ := os.ReadFile(filepath.Join(dir, "a.tar"))
	bb, _ := os.ReadFile(filepath.Join(dir, "b.tar"))
	if string(ab) != string(bb) {
		t.Errorf("the two tarballs differ")
	}

	// A different content gives a different image.
	if err := os.WriteFile(filepath.Join(dir, "node"), []byte("other"), 0o755); err != nil {
		t.Fatal(err)
	}
	o.Out = filepath.Join(dir, "c.tar")
	c, err := build(o)
	if err != nil {
		t.Fatal(err)
	}
	if c.Digest == a.Digest {
		t.Errorf("changed file, same digest %v", c.Digest)
	}
}

func TestBuildErrors(t *testing.T) {
	dir := t.TempDir()
	base := testOptions(t, dir, filepath.Join(dir, "x.tar"))
	arm := filepath.Join(dir, "arm")
	// A minimal ELF64 little-endian header for aarch64 (e_machine 183).
	hdr := make([]byte, 64)
	copy(hdr, "\x7fELF\x02\x01\x01")
	hdr[16], hdr[18] = 2, 183
	hdr[20] = 1
	hdr[52] = 64
	if err := os.WriteFile(arm, hdr, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what   string
		modify func(*options)
		want   string
	}{
		{"no tag", func(o *options) { o.Tag = "shardkv" }, "want name:tag"},
		{"named user", func(o *options) { o.User = "nonroot" }, "numeric uid"},
		{"no files", func(o *options) { o.Files = nil }, "no --file"},
		{"no =", func(o *options) { o.Files = []string{"x"} }, "want SRC=DST"},
		{"relative dst", func(o *options) { o.Files = []string{arm + "=x"} }, "clean absolute path"},
		{"missing src", func(o *options) { o.Files = []string{dir + "/nope=/x"} }, "no such file"},
		{"dir src", func(o *options) { o.Files = []string{dir + "=/x"} }, "not a regular file"},
		{"dup", func(o *options) { o.Files = append(o.Files, o.Files[0]) }, "already in the image"},
		{"tmp", func(o *options) { o.Files = []string{src(o.Files[0]) + "=/tmp"} }, "already in the image"},
		{"file as dir", func(o *options) { o.Files = append(o.Files, src(o.Files[1])+"=/manager/x") }, "is a file"},
		{"arm", func(o *options) { o.Files = []string{arm + "=/arm"} }, "not x86-64"},
		{"bad env", func(o *options) { o.Env = []string{"NOEQUALS"} }, "KEY=VALUE"},
	} {
		o := base
		o.Files = append([]string(nil), base.Files...)
		tc.modify(&o)
		_, err := build(o)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.what, err, tc.want)
		}
	}
	if _, err := os.Stat(base.Out); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed build left %s behind", base.Out)
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".imagebuild-*"))
	if len(left) > 0 {
		t.Errorf("temp files left behind: %q", left)
	}
}

// src is the SRC of a --file SRC=DST.
func src(file string) string {
	s, _, _ := strings.Cut(file, "=")
	return s
}

func TestMergeEnv(t *testing.T) {
	got := mergeEnv([]string{"A=1", "PATH=/x", "A=2"})
	want := []string{"PATH=/x", "A=2"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}
