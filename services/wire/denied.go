package wire

import (
	"errors"
	"regexp"

	"github.com/nats-io/nats.go"

	"github.com/streamwal/streamwal"
)

// deniedPublish finds the subject of a publish permissions violation in
// the error nats.go reports for it.
var deniedPublish = regexp.MustCompile(`(?i)permissions violation for publish to "([^"]+)"`)

// Denied tells a request that went unanswered because the server dropped
// it from one that nobody answered: it returns a PERMISSION_DENIED error
// when the connection's last error is a permissions violation for a
// publish to a subject that match accepts (the request's, say), and nil
// otherwise. A server reports such a violation only to the connection's
// error handler and answers nothing, so without this a request with
// credentials of another cluster waits out its whole deadline.
func Denied(nc *nats.Conn, match func(subject string) bool) error {
	if nc == nil {
		return nil
	}
	last := nc.LastError()
	if !errors.Is(last, nats.ErrPermissionViolation) {
		return nil
	}
	m := deniedPublish.FindStringSubmatch(last.Error())
	if m == nil || !match(m[1]) {
		return nil
	}
	return streamwal.Errorf(streamwal.CodePermissionDenied, "the server refuses these credentials a publish to %q: %w", m[1], last)
}
