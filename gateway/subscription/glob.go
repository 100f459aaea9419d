package subscription

import "strings"

// normalizePath strips leading and trailing slashes from a stream path so
// that "/events/a/" and "events/a" name the same stream.
func normalizePath(p string) string {
	return strings.Trim(p, "/")
}

// splitPath splits a normalised path into its non-empty segments.
func splitPath(p string) []string {
	parts := strings.Split(normalizePath(p), "/")
	out := parts[:0]
	for _, s := range parts {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// globMatch reports whether path matches pattern. A "*" segment matches
// exactly one path segment, a "**" segment matches zero or more segments,
// and any other segment matches itself literally ("%2A" stands for a
// literal "*").
func globMatch(pattern, path string) bool {
	return matchSegments(splitPath(pattern), splitPath(path))
}

func matchSegments(pat, path []string) bool {
	for len(pat) > 0 && len(path) > 0 {
		switch seg := pat[0]; seg {
		case "**":
			for i := 0; i <= len(path); i++ {
				if matchSegments(pat[1:], path[i:]) {
					return true
				}
			}
			return false
		case "*":
		default:
			lit := strings.ReplaceAll(strings.ReplaceAll(seg, "%2A", "*"), "%2a", "*")
			if lit != path[0] {
				return false
			}
		}
		pat, path = pat[1:], path[1:]
	}
	for len(pat) > 0 && pat[0] == "**" {
		pat = pat[1:]
	}
	return len(pat) == 0 && len(path) == 0
}
