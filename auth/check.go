package auth

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// check reports whether have gives role r at least the permissions s
// derives for it: every subject (or wildcard) s allows is within an
// allowed one and collides with no denied one, and answers to requests are
// allowed if r needs them. Nil permissions allow everything.
func (s Spec) check(r Role, have *server.Permissions) error {
	want, err := s.Permissions(r)
	if err != nil || have == nil {
		return err
	}
	if err := checkSubjects("publish", want.Publish.Allow, have.Publish); err != nil {
		return err
	}
	if err := checkSubjects("subscribe", want.Subscribe.Allow, have.Subscribe); err != nil {
		return err
	}
	if want.Response != nil && have.Response == nil {
		return fmt.Errorf("%w: answers to requests (allow_responses) are not allowed", ErrNotCovered)
	}
	return nil
}

// checkSubjects finds the first subject of want that have does not allow.
func checkSubjects(kind string, want []string, have *server.SubjectPermission) error {
	if have == nil {
		return nil
	}
	for _, w := range want {
		allowed := have.Allow == nil || slices.ContainsFunc(have.Allow, func(a string) bool { return covers(a, w) })
		denied := slices.ContainsFunc(have.Deny, func(d string) bool { return server.SubjectsCollide(d, w) })
		if !allowed || denied {
			return fmt.Errorf("%w: %s %q is not allowed", ErrNotCovered, kind, w)
		}
	}
	return nil
}

// covers reports whether every subject pattern matches is also matched by
// filter ('*' matches one token, a final '>' one or more).
func covers(filter, pattern string) bool {
	ft, pt := strings.Split(filter, "."), strings.Split(pattern, ".")
	for i, f := range ft {
		switch {
		case f == ">":
			return i < len(pt)
		case i >= len(pt) || pt[i] == ">":
			return false
		case f != "*" && f != pt[i]:
			return false
		}
	}
	return len(ft) == len(pt)
}
