package acl

import "testing"

// TestGlob compares glob with Redis 7.0.15: each pattern's matches among
// the strings, as KEYS answered on a real redis-server holding one key.
func TestGlob(t *testing.T) {
	strs := []string{"a", "abc", "abd", "acd", "aed", "ace", "a*b", "axb", "a]b", "[abc", "xbxcx", "hello", "hallo", "hillo", "hbllo", "ab\\", "aa", "a-", "[a]", "]", "ax", "]x", "-", "!", "b"}
	matches := map[string][]string{
		"*":         {"a", "abc", "abd", "acd", "aed", "ace", "a*b", "axb", "a]b", "[abc", "abc", "xbxcx", "hello", "hallo", "hillo", "hbllo", "ab\\", "aa", "a-", "[a]", "]", "ax", "]x", "-", "!", "b"},
		"a*":        {"a", "abc", "abd", "acd", "aed", "ace", "a*b", "axb", "a]b", "abc", "ab\\", "aa", "a-", "ax"},
		"*a":        {"a", "aa"},
		"a?c":       {"abc", "abc"},
		"a[bc]d":    {"abd", "acd"},
		"a[^bc]d":   {"aed"},
		"a[b-d]e":   {"ace"},
		"a[d-b]e":   {"ace"},
		"a\\*b":     {"a*b"},
		"a[\\]]b":   {"a]b"},
		"[abc":      {"a", "b"},
		"a[":        {},
		"*b*c*":     {"abc", "[abc", "abc", "xbxcx"},
		"h*llo":     {"hello", "hallo", "hillo", "hbllo"},
		"h?llo":     {"hello", "hallo", "hillo", "hbllo"},
		"h[ae]llo":  {"hello", "hallo"},
		"h[^e]llo":  {"hallo", "hillo", "hbllo"},
		"h[a-b]llo": {"hallo", "hbllo"},
		"ab\\":      {"ab\\"},
		"**a":       {"a", "aa"},
		"a**":       {"a", "abc", "abd", "acd", "aed", "ace", "a*b", "axb", "a]b", "abc", "ab\\", "aa", "a-", "ax"},
		"[]a]":      {},
		"[a-]":      {"a", "]"},
		"a[]":       {},
		"\\[a]":     {"[a]"},
		"[^]]x":     {},
		"*[":        {},
		"?":         {"a", "]", "-", "!", "b"},
		"[!a]":      {"a", "!"},
	}
	for pat, want := range matches {
		for _, s := range strs {
			w := false
			for _, m := range want {
				w = w || m == s
			}
			if got := Glob([]byte(pat), []byte(s), false); got != w {
				t.Errorf("Glob(%q, %q) = %v, Redis says %v", pat, s, got, w)
			}
		}
	}
	// Case folding (CONFIG GET patterns).
	if !Glob([]byte("MAX*"), []byte("maxclients"), true) || Glob([]byte("MAX*"), []byte("maxclients"), false) {
		t.Error("nocase")
	}
	if !Glob([]byte("[A-C]x"), []byte("bx"), true) {
		t.Error("nocase range")
	}
	// Many stars must not take exponential time.
	long := make([]byte, 10000)
	for i := range long {
		long[i] = 'a'
	}
	if Glob([]byte("*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b"), long, false) {
		t.Error("matched without a b")
	}
}
