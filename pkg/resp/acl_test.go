package resp_test

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"testing"
	"time"
)

// testACL: users made with ACL SETUSER are the cluster's (a replica of the
// other group knows them too); a user runs only the commands and touches
// only the keys its rules allow; bad rules change nothing; turning a user
// off or deleting it closes its connections; the default user can be
// turned off; failed AUTHs from a host slow down.
func (e *env) testACL(t *testing.T) {
	addrA, addrB := e.leaderAddr(gA), e.leaderAddr(gB)
	admin := dial(t, addrA)
	defer admin.c.Close()
	expect(t, admin.do("acl", "whoami"), "default")
	expect(t, admin.do("acl", "setuser", "root", "on", ">rootpw", "~*", "+@all"), status("OK"))
	expect(t, admin.do("auth", "root", "rootpw"), status("OK"))
	expect(t, admin.do("acl", "setuser", "alice", "on", ">pw", "~app:*", "+@read", "+@write", "-del", "+acl|whoami"), status("OK"))
	sum := sha256.Sum256([]byte("pw"))
	hash := hex.EncodeToString(sum[:])
	expect(t, admin.do("acl", "getuser", "alice"), []any{"flags", []any{"on"}, "passwords", []any{hash}, "commands", "+@read +@write -del +acl|whoami",
		"keys", "~app:*", "channels", "", "selectors", []any{}})
	list, _ := admin.do("acl", "list").([]any)
	if !slices.Contains(list, any("user alice on #"+hash+" ~app:* resetchannels +@read +@write -del +acl|whoami")) {
		t.Fatalf("ACL LIST %v", list)
	}
	// Bad rules are refused whole: bob is not made.
	if r, ok := admin.do("acl", "setuser", "bob", "on", "+nosuch").(rerr); !ok || !strings.Contains(string(r), "Unknown command") {
		t.Fatalf("SETUSER +nosuch: %v", r)
	}
	for _, bad := range [][]string{{"%R~x"}, {"#abc"}, {"bogus"}, {"+@nosuchcat"}} {
		if _, ok := admin.do(append([]string{"acl", "setuser", "bob"}, bad...)...).(rerr); !ok {
			t.Fatalf("SETUSER bob %v accepted", bad)
		}
	}
	expect(t, admin.do("acl", "getuser", "bob"), nil)

	kA, other := e.keyIn(gA, "app:"), e.keyIn(gA, "other:")
	alice := dial(t, addrA)
	defer alice.c.Close()
	wrong := rerr("WRONGPASS invalid username-password pair or user is disabled.")
	expect(t, alice.do("auth", "alice", "nope"), wrong)
	expect(t, alice.do("auth", "alice", "pw"), status("OK"))
	expect(t, alice.do("acl", "whoami"), "alice")
	expect(t, alice.do("set", kA, "v"), status("OK"))
	expect(t, alice.do("get", kA), "v")
	expect(t, alice.do("set", other, "v"), rerr("NOPERM No permissions to access a key"))
	expect(t, alice.do("mget", kA, other), rerr("NOPERM No permissions to access a key"))
	expect(t, alice.do("del", kA), rerr("NOPERM User alice has no permissions to run the 'del' command"))
	expect(t, alice.do("config", "get", "maxclients"), rerr("NOPERM User alice has no permissions to run the 'config|get' command"))
	expect(t, alice.do("acl", "setuser", "alice", "+@all"), rerr("NOPERM User alice has no permissions to run the 'acl|setuser' command"))

	// The other group's replica learns the users from the controller.
	onB := dial(t, addrB)
	defer onB.c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for onB.do("auth", "alice", "pw") != status("OK") {
		if time.Now().After(deadline) {
			t.Fatal("group B's replica never learned alice")
		}
		time.Sleep(100 * time.Millisecond)
	}
	kB := e.keyIn(gB, "app:")
	expect(t, onB.do("set", kB, "w"), status("OK"))

	// A change applies to open connections: alice loses @write.
	expect(t, admin.do("acl", "setuser", "alice", "-@write"), status("OK"))
	expect(t, alice.do("set", kA, "v2"), rerr("NOPERM User alice has no permissions to run the 'set' command"))
	// Turned off: her connection is closed at its next command.
	expect(t, admin.do("acl", "setuser", "alice", "off"), status("OK"))
	if r, ok := alice.do("get", kA).(rerr); !ok || !strings.HasPrefix(string(r), "NOPERM user alice was deleted or turned off") {
		t.Fatalf("a command of a user turned off: %v", r)
	}
	time.Sleep(50 * time.Millisecond)
	if !alice.closed() {
		t.Fatal("the connection of a user turned off is still open")
	}

	// The default user turned off: new connections must authenticate.
	expect(t, admin.do("acl", "setuser", "default", "off"), status("OK"))
	anon := dial(t, addrA)
	expect(t, anon.do("ping"), rerr("NOAUTH Authentication required."))
	expect(t, anon.do("auth", "default", "x"), wrong)
	anon.c.Close()
	expect(t, admin.do("acl", "setuser", "default", "on"), status("OK"))
	anon = dial(t, addrA)
	expect(t, anon.do("ping"), status("PONG"))
	anon.c.Close()

	// Brute force: each failed AUTH from this host waits longer.
	slow := dial(t, addrA)
	defer slow.c.Close()
	var last time.Duration
	for range 7 {
		start := time.Now()
		expect(t, slow.do("auth", "root", "guess"), wrong)
		last = time.Since(start)
	}
	if last < 300*time.Millisecond {
		t.Errorf("the 7th failed AUTH took %v; want it slowed (>= 300ms)", last)
	}
	expect(t, slow.do("auth", "root", "rootpw"), status("OK")) // a success clears it
	start := time.Now()
	slow.do("auth", "root", "guess")
	if d := time.Since(start); d > 200*time.Millisecond {
		t.Errorf("after a success, a failed AUTH still took %v", d)
	}

	expect(t, admin.do("acl", "deluser", "default"), rerr("ERR The 'default' user cannot be removed"))
	expect(t, admin.do("acl", "deluser", "alice", "root", "nosuch"), int64(2))
	// root is gone: the admin connection, root's, closes.
	if r, ok := admin.do("ping").(rerr); !ok || !strings.HasPrefix(string(r), "NOPERM user root") {
		t.Fatalf("a deleted user's command: %v", r)
	}
}
