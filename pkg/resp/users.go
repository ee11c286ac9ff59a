package resp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/redcon"
	"google.golang.org/grpc/status"

	"github.com/shardkv/shardkv/pkg/resp/acl"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// Users and access control (Redis's ACL, the subset of docs/security.md).
// The users are the cluster's, kept by the controller and polled by the
// backend; every connection is some user's, and every command it sends is
// checked against that user's current rules, so a change applies to
// connections already open. A connection whose user is deleted or turned
// off is closed at its next command.

// userTable is the users parsed from one version of the backend's copy.
type userTable struct {
	version uint64
	loaded  bool // false: the backend has not heard the users yet
	users   map[string]*acl.User
	managed map[string]bool // set by the operator (SetUsers keeps the mark)
}

func (t *userTable) get(name string) *acl.User { return t.users[name] }

// each is an array of show(user) for every user, by name.
func (t *userTable) each(show func(*acl.User) string) []byte {
	names := make([]string, 0, len(t.users))
	for n := range t.users {
		names = append(names, n)
	}
	slices.Sort(names)
	b := redcon.AppendArray(nil, len(names))
	for _, n := range names {
		b = redcon.AppendBulkString(b, show(t.users[n]))
	}
	return b
}

// users returns the current table, parsed again only when the backend's
// version moved. Before the backend first heard the users, every
// connection is refused (LOADING): a replica that just started must not
// let in the default user of a cluster that turned it off.
func (s *Server) users() *userTable {
	u := s.b.Users()
	// Every command asks: the common case is a load, no lock.
	if t := s.userTab.Load(); t.of(u) {
		return t
	}
	s.usersMu.Lock()
	defer s.usersMu.Unlock()
	if t := s.userTab.Load(); t.of(u) {
		return t
	}
	t := &userTable{users: map[string]*acl.User{}, managed: map[string]bool{}}
	if u != nil {
		t.version, t.loaded = u.Version, true
		for _, e := range u.Users {
			p, err := acl.Parse(e.Name, e.Spec)
			if err != nil {
				// Only a front end of another version writes what this
				// one cannot read; the user is left out (fails closed).
				s.log.Error("a user of the cluster cannot be read; it is left out", "user", e.Name, "err", err)
				continue
			}
			t.users[e.Name] = p
			t.managed[e.Name] = e.Managed
		}
		if t.users[acl.DefaultUser] == nil {
			t.users[acl.DefaultUser] = acl.Default(s.cfg.Password)
		}
	}
	s.userTab.Store(t)
	return t
}

// of reports whether t was parsed from u (nil: not heard yet).
func (t *userTable) of(u *shardkvpb.UsersReply) bool {
	return t != nil && (u == nil && !t.loaded || u != nil && t.loaded && t.version == u.Version)
}

const errUsersLoading = "LOADING the cluster's users are not loaded yet; retry"

// startUser is the user a new connection is: the default user when it
// needs no password, else none (AUTH first).
func (c *conn) startUser() {
	t := c.s.users()
	if d := t.get(acl.DefaultUser); d != nil && d.Enabled && d.NoPass {
		c.setUser(acl.DefaultUser)
	}
}

func (c *conn) setUser(name string) {
	c.userMu.Lock()
	c.user = name
	c.userMu.Unlock()
	c.authed.Store(name != "")
}

func (c *conn) userName() string {
	c.userMu.Lock()
	defer c.userMu.Unlock()
	return c.user
}

// checkAccess refuses cmd (with args) when the connection's user may not
// run it or touch one of keys. A user deleted or turned off since the
// connection authenticated closes it (close is true).
func (c *conn) checkAccess(cmd *command, keys [][]byte) (e []byte, closeConn bool) {
	t := c.s.users()
	if !t.loaded {
		return errReply(errUsersLoading), false
	}
	name := c.userName()
	u := t.get(name)
	if u == nil || !u.Enabled {
		return errReply(fmt.Sprintf("NOPERM user %s was deleted or turned off; the connection is closed", name)), true
	}
	if !u.CanRun(cmd.name, cmd.acl) {
		return errReply(fmt.Sprintf("NOPERM User %s has no permissions to run the '%s' command", name, cmd.name)), false
	}
	for _, k := range keys {
		if !u.CanAccess(k) {
			return errReply("NOPERM No permissions to access a key"), false
		}
	}
	return nil, false
}

// Brute force: each failed AUTH from a host delays that host's next ones,
// doubling from authDelayBase up to authDelayMax, and a success clears it.
const (
	authDelayBase  = 10 * time.Millisecond
	authDelayMax   = 2 * time.Second
	maxAuthSources = 4096
)

type authThrottle struct {
	mu    sync.Mutex
	fails map[string]int
}

func (a *authThrottle) delay(host string) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.fails[host]
	if n == 0 {
		return 0
	}
	return min(authDelayBase<<min(n-1, 20), authDelayMax)
}

func (a *authThrottle) record(host string, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fails == nil {
		a.fails = map[string]int{}
	}
	if ok {
		delete(a.fails, host)
		return
	}
	if len(a.fails) >= maxAuthSources {
		clear(a.fails)
	}
	a.fails[host]++
}

func (c *conn) host() string {
	h, _, err := net.SplitHostPort(c.nc.RemoteAddr().String())
	if err != nil {
		return c.nc.RemoteAddr().String()
	}
	return h
}

// authenticate checks credentials as Redis's ACL does. hasUser is false
// for AUTH <password> (the default user). It returns the error reply, or
// nil once the connection is the user's.
func (c *conn) authenticate(user, pass []byte, hasUser bool) []byte {
	t := c.s.users()
	if !t.loaded {
		return errReply(errUsersLoading)
	}
	name := acl.DefaultUser
	if hasUser {
		name = string(user)
	}
	u := t.get(name)
	if !hasUser && u != nil && u.Enabled && u.NoPass {
		return errReply(errNoPass)
	}
	host := c.host()
	if d := c.s.authThrottle.delay(host); d > 0 {
		time.Sleep(d)
	}
	ok := u != nil && u.Authenticate(pass)
	c.s.authThrottle.record(host, ok)
	if !ok {
		c.s.stats.authFailures.Add(1)
		return errReply(errWrongPass)
	}
	c.setUser(name)
	return nil
}

func cmdACLWhoAmI(c *conn, p *pipeline, _ [][]byte, _ int) {
	p.reply(redcon.AppendBulkString(nil, c.userName()))
}

// cmdACLUsers: the names; cmdACLList: each user's ACL LIST line.
func cmdACLUsers(c *conn, p *pipeline, _ [][]byte, _ int) {
	p.reply(c.s.users().each(func(u *acl.User) string { return u.Name }))
}

func cmdACLList(c *conn, p *pipeline, _ [][]byte, _ int) {
	p.reply(c.s.users().each((*acl.User).String))
}

// cmdACLGetUser: Redis 7's fields (flags, passwords, commands, keys,
// channels, selectors).
func cmdACLGetUser(c *conn, p *pipeline, args [][]byte, _ int) {
	u := c.s.users().get(string(args[2]))
	if u == nil {
		p.reply(redcon.AppendNull(nil))
		return
	}
	b := redcon.AppendArray(nil, 12)
	flags := []string{"off"}
	if u.Enabled {
		flags[0] = "on"
	}
	if u.NoPass {
		flags = append(flags, "nopass")
	}
	b = redcon.AppendBulkString(b, "flags")
	b = redcon.AppendArray(b, len(flags))
	for _, f := range flags {
		b = redcon.AppendBulkString(b, f)
	}
	b = redcon.AppendBulkString(b, "passwords")
	b = redcon.AppendArray(b, len(u.Passwords))
	for _, h := range u.Passwords {
		b = redcon.AppendBulkString(b, h)
	}
	cmds := strings.Join(u.Commands, " ")
	if cmds == "" {
		cmds = "-@all"
	}
	var keys []string
	if u.AllKeys {
		keys = append(keys, "~*")
	}
	for _, k := range u.Keys {
		keys = append(keys, "~"+k)
	}
	b = redcon.AppendBulkString(b, "commands")
	b = redcon.AppendBulkString(b, cmds)
	b = redcon.AppendBulkString(b, "keys")
	b = redcon.AppendBulkString(b, strings.Join(keys, " "))
	b = redcon.AppendBulkString(b, "channels")
	b = redcon.AppendBulkString(b, "")
	b = redcon.AppendBulkString(b, "selectors")
	b = redcon.AppendArray(b, 0)
	p.reply(b)
}

func cmdACLCat(c *conn, p *pipeline, args [][]byte, _ int) {
	if len(args) == 2 {
		b := redcon.AppendArray(nil, len(acl.Categories))
		for _, cat := range acl.Categories {
			b = redcon.AppendBulkString(b, cat)
		}
		p.reply(b)
		return
	}
	cat := "@" + strings.ToLower(string(args[2]))
	if !slices.Contains(acl.Categories, cat[1:]) {
		p.reply(errReply(fmt.Sprintf("ERR Unknown category '%s'", args[2])))
		return
	}
	var names []string
	for _, cmd := range c.s.cmds {
		for _, x := range append([]*command{cmd}, cmd.subs...) {
			if slices.Contains(x.acl, cat) && x.run != nil {
				names = append(names, x.name)
			}
		}
	}
	slices.Sort(names)
	b := redcon.AppendArray(nil, len(names))
	for _, n := range names {
		b = redcon.AppendBulkString(b, n)
	}
	p.reply(b)
}

// known is the ACL rules' check of a command name against the table.
func (s *Server) known(name string) bool {
	container, sub, hasSub := strings.Cut(name, "|")
	cmd := s.cmds[container]
	if cmd == nil {
		return false
	}
	return !hasSub || cmd.sub(sub) != nil
}

// changeUsers sends a change of users to the cluster and waits for it.
func (c *conn) changeUsers(req *shardkvpb.SetUsersRequest) ([]byte, bool) {
	ctx, cancel := context.WithTimeout(c.s.ctx, c.s.cfg.WriteTimeout)
	defer cancel()
	if _, err := c.s.b.SetUsers(ctx, req); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return errReply("ERR the user change did not complete in time; its outcome is unknown (ACL GETUSER shows it)"), false
		}
		return errReply("ERR the user change failed: " + strings.ReplaceAll(status.Convert(err).Message(), "\n", " ")), false
	}
	return nil, true
}

func cmdACLSetUser(c *conn, p *pipeline, args [][]byte, _ int) {
	name := string(args[2])
	if strings.ContainsAny(name, " \t\r\n") || name == "" {
		p.reply(errReply("ERR Usernames can't contain spaces or null characters"))
		return
	}
	t := c.s.users()

	u := acl.New(name)
	if cur := t.get(name); cur != nil {
		u = cur
	}
	rules := make([]string, 0, len(args)-3)
	for _, a := range args[3:] {
		rules = append(rules, string(a))
	}
	n := *u
	if err := n.Apply(c.s.known, rules...); err != nil {
		p.reply(errReply("ERR " + err.Error()))
		return
	}
	managed := t.managed[name] // an operator-managed user stays so (its Secret wins at the next sync)
	if e, ok := c.changeUsers(&shardkvpb.SetUsersRequest{Set: []*shardkvpb.User{{Name: name, Spec: n.Spec(), Managed: managed}}}); !ok {
		p.reply(e)
		return
	}
	p.reply(okReply())
}

func cmdACLDelUser(c *conn, p *pipeline, args [][]byte, _ int) {
	t := c.s.users()
	var del []string
	for _, a := range args[2:] {
		n := string(a)
		if n == acl.DefaultUser {
			p.reply(errReply("ERR The 'default' user cannot be removed"))
			return
		}
		if t.get(n) != nil && !slices.Contains(del, n) {
			del = append(del, n)
		}
	}
	if len(del) > 0 {
		if e, ok := c.changeUsers(&shardkvpb.SetUsersRequest{Delete: del}); !ok {
			p.reply(e)
			return
		}
	}
	p.reply(redcon.AppendInt(nil, int64(len(del))))
}

func cmdACLUnsupported(_ *conn, p *pipeline, args [][]byte, _ int) {
	p.reply(errReply(fmt.Sprintf("ERR ACL %s is not supported: the users live in the cluster's controller, not in a file (docs/security.md)", strings.ToUpper(string(args[1])))))
}
