package jetstream

import "strings"

// subjectMatcher matches subjects against NATS subject filters, as a
// consumer's filter subjects do: tokens separated by '.', '*' matches one
// token, '>' (last token only) one or more.
type subjectMatcher struct {
	filters [][]string
}

// newSubjectMatcher returns a matcher of filters; none matches everything.
func newSubjectMatcher(filters []string) *subjectMatcher {
	m := &subjectMatcher{}
	for _, f := range filters {
		m.filters = append(m.filters, strings.Split(f, "."))
	}
	return m
}

// match reports whether subject matches any filter.
func (m *subjectMatcher) match(subject string) bool {
	if len(m.filters) == 0 {
		return true
	}
	for _, f := range m.filters {
		if matchTokens(f, subject) {
			return true
		}
	}
	return false
}

// matchTokens matches one tokenized filter against a subject.
func matchTokens(filter []string, subject string) bool {
	for i, ft := range filter {
		tok, rest, more := strings.Cut(subject, ".")
		switch {
		case ft == ">" && i == len(filter)-1:
			return tok != "" || more
		case ft != "*" && ft != tok:
			return false
		case tok == "":
			return false
		}
		if !more {
			return i == len(filter)-1
		}
		subject = rest
	}
	return false
}
