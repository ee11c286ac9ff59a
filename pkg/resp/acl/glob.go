package acl

// Glob reports whether s matches pattern with Redis's glob rules
// (stringmatchlen in Redis's util.c): * and ? match any run and any byte,
// [abc], [^abc] and [a-z] match a class of bytes, and \ escapes the next
// byte. nocase folds ASCII letters (CONFIG GET patterns).
func Glob(pattern, s []byte, nocase bool) bool {
	skipLonger := false
	return globMatch(pattern, s, nocase, &skipLonger)
}

func lower(b byte) byte {
	if 'A' <= b && b <= 'Z' {
		return b + 'a' - 'A'
	}
	return b
}

// globMatch follows stringmatchlen_impl line by line. skipLonger is its
// early exit: once the rest of the pattern after a * matched nowhere in the
// rest of the string, a longer match of an earlier * cannot help either, so
// a pattern with many stars cannot take exponential time.
func globMatch(p, s []byte, nocase bool, skipLonger *bool) bool {
	// at returns p[i], or 0 past the end (the C code reads the NUL).
	at := func(i int) byte {
		if i < len(p) {
			return p[i]
		}
		return 0
	}
	eq := func(a, b byte) bool {
		if nocase {
			return lower(a) == lower(b)
		}
		return a == b
	}
	for len(p) > 0 && len(s) > 0 {
		switch p[0] {
		case '*':
			for len(p) > 1 && p[1] == '*' {
				p = p[1:]
			}
			if len(p) == 1 {
				return true
			}
			for len(s) > 0 {
				if globMatch(p[1:], s, nocase, skipLonger) {
					return true
				}
				if *skipLonger {
					return false
				}
				s = s[1:]
			}
			*skipLonger = true
			return false
		case '?':
			s = s[1:]
		case '[':
			p = p[1:]
			not := at(0) == '^'
			if not {
				p = p[1:]
			}
			match := false
			for {
				if at(0) == '\\' && len(p) >= 2 {
					p = p[1:]
					if eq(p[0], s[0]) {
						match = true
					}
				} else if at(0) == ']' || len(p) == 0 {
					// The end of the class. For an unterminated class the
					// C code steps back so that the increment below lands on
					// the end of the pattern; here the pattern is empty.
					break
				} else if len(p) >= 3 && p[1] == '-' {
					lo, hi, c := p[0], p[2], s[0]
					if lo > hi {
						lo, hi = hi, lo
					}
					if nocase {
						lo, hi, c = lower(lo), lower(hi), lower(c)
					}
					p = p[2:]
					if lo <= c && c <= hi {
						match = true
					}
				} else if eq(p[0], s[0]) {
					match = true
				}
				p = p[1:]
			}
			if not {
				match = !match
			}
			if !match {
				return false
			}
			s = s[1:]
		case '\\':
			if len(p) >= 2 {
				p = p[1:]
			}
			fallthrough
		default:
			if !eq(p[0], s[0]) {
				return false
			}
			s = s[1:]
		}
		// The C code's pattern++: at the end of an unterminated class the
		// pattern is already empty.
		if len(p) > 0 {
			p = p[1:]
		}
		if len(s) == 0 {
			for len(p) > 0 && p[0] == '*' {
				p = p[1:]
			}
			break
		}
	}
	return len(p) == 0 && len(s) == 0
}
