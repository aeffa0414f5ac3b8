package replicate

import (
	"context"
	"errors"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/read"
)

// catchUpMargin is how far before the TimeTick through which this
// cluster holds the old primary's log a catch-up starts reading its new
// source (whose own clock stamped the replicas it holds of it): clocks
// further apart are caught by the check of the first replica met, and
// the catch-up starts again at the source's first message.
const catchUpMargin = 10 * time.Second

// errStartedLate is a catch-up whose first replica of the old primary
// was one this cluster does not hold: it may have missed earlier ones.
var errStartedLate = errors.New("catch-up started after a replica this cluster misses; starting again at the source's first message")

// scope is what an attempt copies of its source's log: the source's own
// messages from a point on, and the replicas of other clusters it holds
// (relayed, as messages of the source's log).
type scope struct {
	// self is this cluster, whose own messages are never copied back.
	self streamwal.Cluster
	// of, when set (a catch-up), limits the replicas relayed to those of
	// cluster of above its TimeTick after, through which this cluster
	// holds of's log already.
	of    streamwal.Cluster
	after messages.TimeTick
	// own: the source's own messages below it are not copied (in a
	// catch-up, those of before the source took its role).
	own messages.MessageID
	// check: the first replica of of met must be one this cluster holds
	// already (at or below after), or the attempt started too late.
	check bool
}

// copies reports whether the attempt copies m (a transaction by its
// CommitTxn).
func (s *scope) copies(m *messages.ImmutableMessage) (bool, error) {
	h := m.Replicate()
	switch {
	case h == nil:
		return m.ID() >= s.own, nil
	case h.Cluster == s.self:
		return false, nil
	case s.of == "":
		return true, nil
	case h.Cluster != s.of:
		return false, nil
	}
	if s.check {
		s.check = false
		if h.TimeTick > s.after {
			return false, errStartedLate
		}
	}
	return h.TimeTick > s.after, nil
}

// plan is where an attempt on src starts (the position and the TimeTick
// past which messages count) and sets src.scope. When the last replica
// that landed is of another cluster than src (the old primary of a
// failover or switchover), the attempt catches up: it copies the
// replicas of that cluster src holds above it, then src's own messages
// from where it took its role (startAt, by PChannel index). Otherwise it
// starts after the later of what landed and what the replicator
// acknowledged, or, with neither, at startAt (the edge's start), or at
// src's first message.
func (r *replicator) plan(ctx context.Context, src *source, landed *position, startAt []messages.MessageID) (read.Start, messages.TimeTick, error) {
	c := src.member.Cluster
	var at messages.MessageID
	if i := r.p.Index(); i < len(startAt) {
		at = startAt[i]
	}
	src.scope = scope{self: r.self}
	pos := r.own(c, src.p, landed)
	if landed != nil && landed.Cluster != c {
		src.scope.of, src.scope.after, src.scope.own = landed.Cluster, landed.TimeTick, at
		start, err := r.catchUpStart(ctx, src, landed.TimeTick, at)
		return start, 0, err
	}
	switch {
	case pos != nil && pos.LastConfirmed > 0:
		return read.From(pos.LastConfirmed), pos.TimeTick + 1, nil
	case at > 0:
		return read.From(at), 0, nil
	}
	return read.Earliest(), 0, nil
}

// catchUpStart is where a catch-up of the old primary's log through t
// starts in src: catchUpMargin before t by src's TimeTicks (at the latest
// where src took its role, at), or at src's first message once a
// catch-up started too late.
func (r *replicator) catchUpStart(ctx context.Context, src *source, t messages.TimeTick, at messages.MessageID) (read.Start, error) {
	if r.late {
		r.late = false
		return read.Earliest(), nil
	}
	pos, err := read.Locate(ctx, src.be, src.p, messages.TimeTickAt(t.Physical().Add(-catchUpMargin)))
	if err != nil {
		return read.Start{}, err
	}
	id := pos.ID
	if pos.Kind == jetstream.StartAfter {
		id++
	}
	if at > 0 && at < id {
		id = at
	}
	if id <= 1 {
		return read.Earliest(), nil
	}
	src.scope.check = true
	return read.From(id), nil
}
