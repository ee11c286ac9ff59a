// Command imagebuild builds a single-layer linux/amd64 container image from
// local files and writes it as a docker-save tarball (what `docker load` and
// `ctr images import` read), with no Docker daemon and no base image.
// hack/build-images.sh uses it for the shardkv and pause images.
//
//	go run ./hack/imagebuild --tag shardkv:dev --out shardkv_dev.tar \
//	    --user 65532:65532 --cmd /manager \
//	    --file bin/manager=/manager --file bin/node=/node --file bin/kvctl=/kvctl
//
// The layer holds the --file files (owned by root, mode 0755, whatever their
// mode on disk), their parent directories, and /tmp (mode 1777); nothing
// else (no shell, no /etc/passwd: --user must be numeric). The image config
// sets User, Entrypoint, Cmd, WorkingDir (/) and Env (PATH, plus --env).
//
// The build is reproducible: every timestamp (file mtimes, the config's
// created time) is SOURCE_DATE_EPOCH if set, else the Unix epoch, and the
// layer's entries are sorted, so the same inputs give the same image digest.
package main

import (
	"archive/tar"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// defaultPath is the PATH Docker gives a Linux image that sets none.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// options is one build: what main parses from the command line.
type options struct {
	Tag        string   // repository:tag written into the tarball, e.g. shardkv:dev
	Out        string   // the tarball to write
	User       string   // config User, "uid[:gid]"; empty: root
	Entrypoint []string // config Entrypoint; nil: none
	Cmd        []string // config Cmd; nil: none
	Env        []string // config Env, KEY=VALUE, after PATH (a PATH here replaces it)
	Files      []string // SRC=DST: host file SRC at absolute path DST in the image
	Created    time.Time
}

// Result describes a written image.
type Result struct {
	// ID is the config's digest, the image ID: `docker images` and
	// `crictl images` show it, and it is the same wherever the tarball is
	// loaded.
	ID v1.Hash
	// Digest is go-containerregistry's manifest digest. A docker-save
	// tarball carries no manifest, so containerd writes its own on import:
	// `ctr images ls` shows a different (but as reproducible) digest.
	Digest v1.Hash
	Size   int64 // the tarball's size in bytes
}

func main() {
	var o options
	var ep, cmd, env, files listFlag
	flag.StringVar(&o.Tag, "tag", "", "image `name:tag`, e.g. shardkv:dev (required)")
	flag.StringVar(&o.Out, "out", "", "docker-save tarball to write (required)")
	flag.StringVar(&o.User, "user", "", "numeric `uid[:gid]` the container runs as (default root)")
	flag.Var(&ep, "entrypoint", "an Entrypoint `arg`; repeat for more")
	flag.Var(&cmd, "cmd", "a Cmd `arg`; repeat for more")
	flag.Var(&env, "env", "an extra `KEY=VALUE` in the config's Env; repeat for more")
	flag.Var(&files, "file", "`SRC=DST`: put host file SRC at absolute path DST; repeat for more")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: imagebuild --tag NAME:TAG --out FILE.tar [--user UID:GID] [--entrypoint ARG]... [--cmd ARG]... [--env K=V]... --file SRC=DST...\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		fail(fmt.Errorf("unexpected argument %q (files go in --file SRC=DST)", flag.Arg(0)))
	}
	o.Entrypoint, o.Cmd, o.Env, o.Files = ep, cmd, env, files
	var err error
	if o.Created, err = sourceDateEpoch(); err != nil {
		fail(err)
	}
	res, err := build(o)
	if err != nil {
		fail(err)
	}
	fmt.Fprintf(os.Stderr, "imagebuild: wrote %s: %s, ID %s, %.1f MB\n", o.Out, o.Tag, res.ID, float64(res.Size)/1e6)
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "imagebuild: %v\n", err)
	os.Exit(1)
}

// sourceDateEpoch is the time every timestamp in the image gets:
// $SOURCE_DATE_EPOCH (reproducible-builds.org) or the Unix epoch.
func sourceDateEpoch() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since the epoch", s)
	}
	return time.Unix(n, 0).UTC(), nil
}

var userRE = regexp.MustCompile(`^[0-9]+(:[0-9]+)?$`)

// entry is one file or directory of the layer.
type entry struct {
	dir  bool
	src  string // a file's host path
	mode int64  // permission bits (and the sticky bit)
}

// build writes the image o describes to o.Out.
func build(o options) (Result, error) {
	if o.Out == "" {
		return Result{}, errors.New("--out is required")
	}
	// name.StrictValidation would also insist on a registry host; only the
	// explicit tag is required here.
	if strings.LastIndex(o.Tag, ":") <= strings.LastIndex(o.Tag, "/") {
		return Result{}, fmt.Errorf("--tag %q: want name:tag, e.g. shardkv:dev", o.Tag)
	}
	tag, err := name.NewTag(o.Tag)
	if err != nil {
		return Result{}, fmt.Errorf("--tag %q: want name:tag (%v)", o.Tag, err)
	}
	if o.User != "" && !userRE.MatchString(o.User) {
		return Result{}, fmt.Errorf("--user %q: want a numeric uid or uid:gid (the image has no /etc/passwd to look names up in)", o.User)
	}
	for _, e := range o.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return Result{}, fmt.Errorf("--env %q: want KEY=VALUE", e)
		}
	}
	entries, err := layerEntries(o.Files)
	if err != nil {
		return Result{}, err
	}

	// The layer's uncompressed tar goes to a temp file beside the output (the
	// binaries can be large); go-containerregistry gzips it from there.
	outDir := filepath.Dir(o.Out)
	layerTar, err := os.CreateTemp(outDir, ".imagebuild-layer-*.tar")
	if err != nil {
		return Result{}, fmt.Errorf("temp file for the layer: %w", err)
	}
	defer os.Remove(layerTar.Name())
	if err := writeLayer(layerTar, entries, o.Created); err != nil {
		layerTar.Close()
		return Result{}, fmt.Errorf("writing the layer: %w", err)
	}
	if err := layerTar.Close(); err != nil {
		return Result{}, fmt.Errorf("writing the layer: %w", err)
	}
	layer, err := tarball.LayerFromFile(layerTar.Name(), tarball.WithCompressedCaching)
	if err != nil {
		return Result{}, fmt.Errorf("reading the layer back: %w", err)
	}

	dsts := make([]string, 0, len(entries))
	for p, e := range entries {
		if !e.dir {
			dsts = append(dsts, "/"+p)
		}
	}
	sort.Strings(dsts)
	created := v1.Time{Time: o.Created}
	img, err := mutate.Append(empty.Image, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   created,
			CreatedBy: "hack/imagebuild: " + strings.Join(dsts, " ") + " /tmp",
			Comment:   "shardkv",
		},
	})
	if err != nil {
		return Result{}, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return Result{}, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = created
	cf.Config = v1.Config{
		User:       o.User,
		Entrypoint: o.Entrypoint,
		Cmd:        o.Cmd,
		Env:        mergeEnv(o.Env),
		WorkingDir: "/",
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return Result{}, err
	}
	digest, err := img.Digest()
	if err != nil {
		return Result{}, err
	}
	id, err := img.ConfigName()
	if err != nil {
		return Result{}, err
	}

	// Write to a temp name and rename, so a failed build leaves no
	// half-written tarball behind.
	tmp, err := os.CreateTemp(outDir, ".imagebuild-*.tar")
	if err != nil {
		return Result{}, fmt.Errorf("creating the output: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	if err := tarball.WriteToFile(tmp.Name(), tag, img); err != nil {
		return Result{}, fmt.Errorf("writing %s: %w", o.Out, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return Result{}, err
	}
	if err := os.Rename(tmp.Name(), o.Out); err != nil {
		return Result{}, fmt.Errorf("writing %s: %w", o.Out, err)
	}
	st, err := os.Stat(o.Out)
	if err != nil {
		return Result{}, err
	}
	return Result{ID: id, Digest: digest, Size: st.Size()}, nil
}

// mergeEnv is PATH followed by extra; a KEY in extra replaces an earlier one.
func mergeEnv(extra []string) []string {
	env := []string{defaultPath}
	for _, kv := range extra {
		k, _, _ := strings.Cut(kv, "=")
		replaced := false
		for i, old := range env {
			if strings.HasPrefix(old, k+"=") {
				env[i], replaced = kv, true
			}
		}
		if !replaced {
			env = append(env, kv)
		}
	}
	return env
}

// layerEntries maps each path in the layer (relative, no leading slash) to
// its entry: the --file SRC=DST files, their parent directories, and /tmp.
func layerEntries(files []string) (map[string]entry, error) {
	if len(files) == 0 {
		return nil, errors.New("no --file SRC=DST given: the image would be empty")
	}
	entries := map[string]entry{"tmp": {dir: true, mode: 0o1777}}
	for _, f := range files {
		src, dst, ok := strings.Cut(f, "=")
		if !ok || src == "" || dst == "" {
			return nil, fmt.Errorf("--file %q: want SRC=DST", f)
		}
		if !path.IsAbs(dst) || path.Clean(dst) != dst || dst == "/" {
			return nil, fmt.Errorf("--file %q: DST must be a clean absolute path of a file, like /manager", f)
		}
		if err := checkFile(src); err != nil {
			return nil, fmt.Errorf("--file %q: %w", f, err)
		}
		rel := dst[1:]
		if _, dup := entries[rel]; dup {
			return nil, fmt.Errorf("--file %q: %s is already in the image", f, dst)
		}
		entries[rel] = entry{src: src, mode: 0o755}
		for d := path.Dir(rel); d != "."; d = path.Dir(d) {
			if e, ok := entries[d]; ok && !e.dir {
				return nil, fmt.Errorf("--file %q: /%s is a file, not a directory", f, d)
			}
			if _, ok := entries[d]; !ok {
				entries[d] = entry{dir: true, mode: 0o755}
			}
		}
	}
	return entries, nil
}

// checkFile fails unless src is a regular file (after symlinks) and, if an
// ELF binary, one for linux/amd64 (the image's platform).
func checkFile(src string) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", src)
	}
	f, err := elf.Open(src)
	if err != nil {
		var fe *elf.FormatError
		if errors.As(err, &fe) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil // not an ELF file: a script, a config file, ...
		}
		return err
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("%s is an ELF binary for %v, not x86-64 (build it with GOOS=linux GOARCH=amd64)", src, f.Machine)
	}
	return nil
}

// writeLayer writes the entries as a tar to w, sorted by path (parents sort
// before their children), all owned by root and stamped mtime.
func writeLayer(w io.Writer, entries map[string]entry, mtime time.Time) error {
	paths := make([]string, 0, len(entries))
	for p := range entries {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	tw := tar.NewWriter(w)
	for _, p := range paths {
		e := entries[p]
		hdr := &tar.Header{
			Name:    p,
			Mode:    e.mode,
			ModTime: mtime,
			Uname:   "root",
			Gname:   "root",
		}
		if e.dir {
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			continue
		}
		if err := copyFile(tw, hdr, e.src); err != nil {
			return err
		}
	}
	return tw.Close()
}

func copyFile(tw *tar.Writer, hdr *tar.Header, src string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	hdr.Typeflag = tar.TypeReg
	hdr.Size = st.Size()
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if _, err := io.Copy(tw, f); err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	return nil
}
