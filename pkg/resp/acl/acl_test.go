package acl

import (
	"slices"
	"strings"
	"testing"
)

func TestRulesAndChecks(t *testing.T) {
	u := New("alice")
	if u.Authenticate([]byte("")) || u.CanRun("get", []string{"@read"}) || u.CanAccess([]byte("k")) {
		t.Fatal("a new user is off, with no commands and no keys")
	}
	if err := u.Apply(nil, "on", ">pw", ">pw2", "<pw2", "~app:*", "~{t}*", "+@read", "-@dangerous", "+set", "+config", "-config|set"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		cats []string
		want bool
	}{
		{"get", []string{"@read", "@string", "@fast"}, true},
		{"set", []string{"@write", "@string", "@slow"}, true},
		{"del", []string{"@keyspace", "@write", "@slow"}, false},
		{"keys", []string{"@keyspace", "@read", "@slow", "@dangerous"}, false}, // -@dangerous after +@read
		{"config|get", []string{"@admin", "@slow", "@dangerous"}, true},        // +config after -@dangerous
		{"config|set", []string{"@admin", "@slow", "@dangerous"}, false},
	} {
		if got := u.CanRun(c.name, c.cats); got != c.want {
			t.Errorf("CanRun(%s) = %v, want %v", c.name, got, c.want)
		}
	}
	for key, want := range map[string]bool{"app:1": true, "{t}x": true, "other": false, "ap": false} {
		if got := u.CanAccess([]byte(key)); got != want {
			t.Errorf("CanAccess(%s) = %v", key, got)
		}
	}
	if !u.Authenticate([]byte("pw")) || u.Authenticate([]byte("pw2")) || u.Authenticate([]byte("x")) {
		t.Fatal("passwords: pw opens, the removed pw2 and others do not")
	}
	// The spec holds no password, and reads back as the same user.
	if strings.Contains(u.Spec(), "pw") {
		t.Fatalf("spec %q holds a password", u.Spec())
	}
	back, err := Parse("alice", u.Spec())
	if err != nil || !slices.Equal(back.Rules(), u.Rules()) {
		t.Fatalf("Parse(Spec) = %v, %v; want %v", back.Rules(), err, u.Rules())
	}
	// A failed Apply changes nothing.
	before := u.Spec()
	if err := u.Apply(nil, "off", "~x", "%R~y"); err == nil || !strings.Contains(err.Error(), "%R~y") {
		t.Fatalf("Apply with %%R~: %v", err)
	}
	if u.Spec() != before {
		t.Fatalf("a failed Apply changed the user: %q -> %q", before, u.Spec())
	}
	for _, bad := range []string{"#xyz", "!" + strings.Repeat("a", 64), "+@nosuch", "nonsense", "+a|b|c", "(+get)", "", "~a b", "+get x"} {
		if err := New("x").Apply(nil, bad); err == nil {
			t.Errorf("rule %q accepted", bad)
		}
	}
	if err := New("x").Apply(func(string) bool { return false }, "+get"); err == nil {
		t.Error("+get accepted by a table that does not know it")
	}
	// allkeys then a pattern is an error, as in Redis; resetkeys clears.
	if err := New("x").Apply(nil, "allkeys", "~a"); err == nil {
		t.Error("~a after allkeys accepted")
	}
	d := Default("")
	if !d.Enabled || !d.NoPass || !d.AllKeys || !d.CanRun("flushall", []string{"@write", "@dangerous"}) {
		t.Fatalf("default user %v", d)
	}
	if Default("s").Authenticate([]byte("x")) || !Default("s").Authenticate([]byte("s")) {
		t.Fatal("default user with --requirepass")
	}
}

func TestParseLine(t *testing.T) {
	u, err := ParseLine("user app on >secret ~app:* +@all -@dangerous")
	if err != nil || u.Name != "app" || !u.Authenticate([]byte("secret")) {
		t.Fatalf("ParseLine: %v, %v", u, err)
	}
	for _, l := range []string{"", "   ", "# a comment"} {
		if u, err := ParseLine(l); u != nil || err != nil {
			t.Errorf("ParseLine(%q) = %v, %v", l, u, err)
		}
	}
	for _, l := range []string{"app on", "user", "user x +@nosuch"} {
		if _, err := ParseLine(l); err == nil {
			t.Errorf("ParseLine(%q) accepted", l)
		}
	}
}

// FuzzRules: any rules either fail, changing nothing, or give a user whose
// canonical spec holds no plain password and reads back the same.
func FuzzRules(f *testing.F) {
	for _, s := range []string{"on >pw ~a* +@all -del", "off nopass allkeys -@all +get", "reset", "#" + strings.Repeat("ab", 32) + " !x", "+config|get -config", "~* ~x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, rules string) {
		u := New("f")
		before := u.Spec()
		fields := strings.Fields(rules)
		if err := u.Apply(nil, fields...); err != nil {
			if u.Spec() != before {
				t.Fatalf("failed Apply changed the user")
			}
			return
		}
		// Passwords are kept only as hashes: no canonical rule adds or
		// removes a plain password.
		for _, got := range u.Rules() {
			if got != "" && (got[0] == '>' || got[0] == '<') {
				t.Fatalf("spec %q holds a plain password rule %q", u.Spec(), got)
			}
		}
		back, err := Parse("f", u.Spec())
		if err != nil || !slices.Equal(back.Rules(), u.Rules()) {
			t.Fatalf("Parse(%q) = %v, %v; want %v", u.Spec(), back, err, u.Rules())
		}
		u.CanRun("get", []string{"@read"})
		u.CanAccess([]byte("k"))
	})
}
