// Package acl is the Redis front end's access control: users, the rule
// grammar of ACL SETUSER and of ACL files (a documented subset of Redis
// 7's, docs/security.md), their canonical text (passwords only as SHA-256
// hashes, so the replicated copy never holds a password), and the check
// of a command and its keys against a user. It also has Redis's glob
// patterns (glob.go), which key patterns use. It is a leaf, so that the
// operator and kvctl can turn users into canonical text without linking
// the server.
package acl

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
)

// Categories are Redis 7's command categories (ACL CAT).
var Categories = []string{"keyspace", "read", "write", "set", "sortedset", "list", "hash", "string", "bitmap", "hyperloglog",
	"geo", "stream", "pubsub", "admin", "fast", "slow", "blocking", "dangerous", "connection", "transaction", "scripting"}

// DefaultUser is the user a connection starts as.
const DefaultUser = "default"

// User is one user.
type User struct {
	Name    string
	Enabled bool
	NoPass  bool
	// Passwords are hex SHA-256 hashes, sorted.
	Passwords []string
	// AllKeys: every key; else Keys are the patterns a key must match one of.
	AllKeys bool
	Keys    []string
	// Commands are the command rules in order ("+@all", "-flushall",
	// "+config|get"); the last that matches a command decides.
	Commands []string
}

// New is a new user as ACL SETUSER makes one: off, no password, no keys,
// no commands.
func New(name string) *User { return &User{Name: name} }

// Default is the default user of a cluster without users: on, no
// password, every key and command; with a password (--requirepass), that
// password.
func Default(password string) *User {
	u := &User{Name: DefaultUser, Enabled: true, AllKeys: true, Commands: []string{"+@all"}}
	if password == "" {
		u.NoPass = true
	} else {
		u.Passwords = []string{Hash([]byte(password))}
	}
	return u
}

// Hash is how a password is kept: hex SHA-256, as ACL GETUSER shows it.
func Hash(pass []byte) string {
	h := sha256.Sum256(pass)
	return hex.EncodeToString(h[:])
}

// Known reports whether a command (or "container|sub") exists; nil
// accepts any name (the operator and kvctl, which have no command table).
type Known func(name string) bool

// Apply applies rules as ACL SETUSER does, in order; on an error u is
// unchanged and the error names the rule.
func (u *User) Apply(known Known, rules ...string) error {
	n := u.clone()
	for _, r := range rules {
		if msg := n.apply(known, r); msg != "" {
			return &RuleError{Rule: r, Msg: msg}
		}
	}
	*u = *n
	return nil
}

func (u *User) clone() *User {
	c := *u
	c.Passwords, c.Keys, c.Commands = slices.Clone(u.Passwords), slices.Clone(u.Keys), slices.Clone(u.Commands)
	return &c
}

// RuleError is a rule refused, in Redis's words.
type RuleError struct{ Rule, Msg string }

func (e *RuleError) Error() string {
	return fmt.Sprintf("Error in ACL SETUSER modifier '%s': %s", e.Rule, e.Msg)
}

// Redis's messages for refused rules.
const (
	msgSyntax         = "Syntax error"
	msgUnknownCommand = "Unknown command or category name in ACL"
	msgBadHash        = "The password hash must be exactly 64 characters and contain only lowercase hexadecimal characters"
	msgNoSuchHash     = "no such password hash"
	msgAfterAllKeys   = "Adding a pattern after the * pattern (or the 'allkeys' flag) is not valid and does not have any effect. Try 'resetkeys' to start with an empty list of patterns"
	msgSpaceInPattern = "a key pattern may not contain white space"
	msgRWKeys         = "read/write key permissions (%R~, %W~) are not supported here: use ~pattern"
	msgSelectors      = "selectors are not supported here"
)

func (u *User) apply(known Known, r string) string {
	lr := strings.ToLower(r)
	switch lr {
	case "on":
		u.Enabled = true
	case "off":
		u.Enabled = false
	case "nopass":
		u.NoPass, u.Passwords = true, nil
	case "resetpass":
		u.NoPass, u.Passwords = false, nil
	case "allkeys", "~*":
		u.AllKeys, u.Keys = true, nil
	case "resetkeys":
		u.AllKeys, u.Keys = false, nil
	case "allcommands", "+@all":
		u.Commands = []string{"+@all"}
	case "nocommands", "-@all":
		u.Commands = nil
	case "allchannels", "resetchannels":
		// No pub/sub here: channel rules change nothing.
	case "reset":
		*u = User{Name: u.Name}
	default:
		return u.applyArg(known, r, lr)
	}
	return ""
}

func (u *User) applyArg(known Known, r, lr string) string {
	if r == "" {
		return msgSyntax
	}
	arg := r[1:]
	switch r[0] {
	case '>':
		u.addPassword(Hash([]byte(arg)))
	case '<':
		u.removePassword(Hash([]byte(arg)))
	case '#', '!':
		h := strings.ToLower(arg)
		if b, err := hex.DecodeString(h); err != nil || len(b) != sha256.Size {
			return msgBadHash
		}
		if r[0] == '#' {
			u.addPassword(h)
		} else if !slices.Contains(u.Passwords, h) {
			return msgNoSuchHash
		} else {
			u.removePassword(h)
		}
	case '~':
		if strings.ContainsAny(arg, " \t\r\n") {
			return msgSpaceInPattern
		}
		if u.AllKeys {
			return msgAfterAllKeys
		}
		if !slices.Contains(u.Keys, arg) {
			u.Keys = append(u.Keys, arg)
		}
	case '&':
		// Channels: no pub/sub here.
	case '%':
		return msgRWKeys
	case '(':
		return msgSelectors
	case '+', '-':
		return u.addCommandRule(known, lr)
	default:
		return msgSyntax
	}
	return ""
}

func (u *User) addPassword(h string) {
	u.NoPass = false
	if !slices.Contains(u.Passwords, h) {
		u.Passwords = append(u.Passwords, h)
		slices.Sort(u.Passwords)
	}
}

func (u *User) removePassword(h string) {
	u.Passwords = slices.DeleteFunc(u.Passwords, func(p string) bool { return p == h })
}

func (u *User) addCommandRule(known Known, r string) string {
	name := r[1:]
	if cat, ok := strings.CutPrefix(name, "@"); ok {
		if cat != "all" && !slices.Contains(Categories, cat) {
			return msgUnknownCommand
		}
	} else {
		if name == "" || strings.Count(name, "|") > 1 || strings.ContainsAny(name, " \t\r\n") {
			return msgSyntax
		}
		if known != nil && !known(name) {
			return msgUnknownCommand
		}
	}
	u.Commands = append(u.Commands, r)
	return ""
}

// Rules is the user's canonical rule text, as ACL LIST shows it: on|off,
// then passwords (hashes), keys, and command rules.
func (u *User) Rules() []string {
	out := []string{"off"}
	if u.Enabled {
		out[0] = "on"
	}
	if u.NoPass {
		out = append(out, "nopass")
	}
	for _, p := range u.Passwords {
		out = append(out, "#"+p)
	}
	if u.AllKeys {
		out = append(out, "~*")
	}
	for _, k := range u.Keys {
		out = append(out, "~"+k)
	}
	out = append(out, "resetchannels")
	if len(u.Commands) == 0 {
		out = append(out, "-@all")
	}
	return append(out, u.Commands...)
}

// Spec is the canonical text the cluster stores for the user (Rules,
// space-separated). Parse reads it back.
func (u *User) Spec() string { return strings.Join(u.Rules(), " ") }

// String is the user's ACL LIST line.
func (u *User) String() string { return "user " + u.Name + " " + u.Spec() }

// Parse reads a user from its stored spec (rules without the name).
func Parse(name, spec string) (*User, error) {
	u := New(name)
	if err := u.Apply(nil, strings.Fields(spec)...); err != nil {
		return nil, err
	}
	return u, nil
}

// ParseLine reads one ACL file line, "user <name> <rules...>"; blank lines
// and # comments give nil.
func ParseLine(line string) (*User, error) {
	f := strings.Fields(line)
	if len(f) == 0 || strings.HasPrefix(f[0], "#") {
		return nil, nil
	}
	if f[0] != "user" || len(f) < 2 {
		return nil, fmt.Errorf("%q: an ACL line is 'user <name> <rules...>'", line)
	}
	u := New(f[1])
	if err := u.Apply(nil, f[2:]...); err != nil {
		return nil, fmt.Errorf("user %s: %w", f[1], err)
	}
	return u, nil
}

// Authenticate reports whether pass opens this user: it is on and has no
// password, or pass is one of its passwords. The comparison takes the
// same time whichever password matches.
func (u *User) Authenticate(pass []byte) bool {
	if !u.Enabled {
		return false
	}
	if u.NoPass {
		return true
	}
	h := []byte(Hash(pass))
	ok := 0
	for _, p := range u.Passwords {
		ok |= subtle.ConstantTimeCompare(h, []byte(p))
	}
	return ok == 1
}

// CanRun reports whether the user may run the command name ("container|sub"
// for a subcommand) whose categories (with or without the @) are given.
func (u *User) CanRun(name string, categories []string) bool {
	container, _, _ := strings.Cut(name, "|")
	allowed := false
	for _, r := range u.Commands {
		on, what := r[0] == '+', r[1:]
		switch {
		case what == "@all":
			allowed = on
		case what[0] == '@':
			for _, c := range categories {
				if strings.TrimPrefix(c, "@") == what[1:] {
					allowed = on
					break
				}
			}
		case what == name || what == container:
			allowed = on
		}
	}
	return allowed
}

// CanAccess reports whether the user may touch key.
func (u *User) CanAccess(key []byte) bool {
	if u.AllKeys {
		return true
	}
	for _, p := range u.Keys {
		if Glob([]byte(p), key, false) {
			return true
		}
	}
	return false
}
