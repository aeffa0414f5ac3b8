package client

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/streamwal/streamwal"
)

// DefaultLeaseTTL is how long a group member's lease on a VChannel lasts
// without a renewal: a member that dies loses its VChannels to the others
// within about this long (members renew three times a TTL).
const DefaultLeaseTTL = 3 * time.Second

// groupOptions configure a group member.
type groupOptions struct {
	member string
	ttl    time.Duration
}

// SubscribeGroup makes the subscription a group: every Subscribe of its
// name with SubscribeGroup is a member, the members share the
// subscription's VChannels (each read by exactly one member at a time,
// under a lease in the subscriptions bucket) and its positions. When a
// member stops or dies, the others take its VChannels over within a few
// seconds (SubscribeLeaseTTL) and resume from the group's acknowledged
// positions. member names the member (a letter or digit, then letters,
// digits or '-'); "" makes one up.
func SubscribeGroup(member string) SubscribeOption {
	return func(o *subscribeOptions) { o.group = &groupOptions{member: member} }
}

// SubscribeLeaseTTL sets how long a group member's leases last without a
// renewal (default DefaultLeaseTTL); it needs SubscribeGroup.
func SubscribeLeaseTTL(d time.Duration) SubscribeOption {
	return func(o *subscribeOptions) { o.leaseTTL = d }
}

// checkGroup validates the group options (nil: not a group) and fills in
// the lease TTL.
func checkGroup(name string, g *groupOptions, ttl time.Duration) error {
	if g == nil {
		if ttl != 0 {
			return streamwal.Errorf(streamwal.CodeInvalidArgument, "subscription %s: SubscribeLeaseTTL needs SubscribeGroup", name)
		}
		return nil
	}
	g.ttl = ttl
	if ttl == 0 {
		g.ttl = DefaultLeaseTTL
	}
	if g.member == "" {
		g.member = "m-" + strings.ToLower(nuid.Next())
	}
	if err := streamwal.CheckSubscriptionName(g.member); err != nil {
		return err
	}
	if g.ttl <= 0 {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "group %s: the lease TTL must be positive", name)
	}
	return nil
}

// lease is the stored value of streamwal.SubscriptionLeaseKey (the member
// that reads a VChannel) and of streamwal.SubscriptionMemberKey (a live
// member): valid until Expires unless renewed.
type lease struct {
	Member  string    `json:"member"`
	Expires time.Time `json:"expires"`
}

// held is a lease this member holds, with the revision it last wrote.
type held struct {
	rev     uint64
	expires time.Time
}

// groupMember runs a member's share of a group: its heartbeat, the leases
// of the VChannels it reads, and the rebalancing.
type groupMember struct {
	s   *Subscription
	vs  []streamwal.VChannel
	opt groupOptions

	mu     sync.Mutex
	leases map[streamwal.VChannel]held

	stopc chan struct{}
	done  chan struct{}
}

// joinGroup starts s as a member sharing vs.
func (s *Subscription) joinGroup(ctx context.Context, vs []streamwal.VChannel) error {
	g := &groupMember{s: s, vs: vs, opt: *s.opts.group, leases: map[streamwal.VChannel]held{},
		stopc: make(chan struct{}), done: make(chan struct{})}
	s.mu.Lock()
	s.group = g
	s.mu.Unlock()
	if err := g.round(ctx); err != nil {
		close(g.done)
		return err
	}
	go g.run()
	return nil
}

// run rebalances three times a TTL until stopped.
func (g *groupMember) run() {
	defer close(g.done)
	t := time.NewTicker(g.opt.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-g.stopc:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(g.s.ctx, g.opt.ttl)
		if err := g.round(ctx); err != nil && g.s.ctx.Err() == nil {
			g.s.c.opts.logger.Warn().Err(err).Str("group", g.s.name).Str("member", g.opt.member).Msg("group round failed")
		}
		cancel()
	}
}

// stop ends the rounds.
func (g *groupMember) stop() {
	close(g.stopc)
	<-g.done
}

// round renews the member's heartbeat and leases, drops what it lost,
// gives back what is beyond its fair share, and takes free VChannels up
// to it.
func (g *groupMember) round(ctx context.Context) error {
	now := time.Now()
	if err := g.beat(ctx, now); err != nil {
		return err
	}
	members, err := g.members(ctx, now)
	if err != nil {
		return err
	}
	share := (len(g.vs) + members - 1) / members
	mine := 0
	for _, v := range g.vs {
		if g.renew(ctx, v, now) {
			mine++
		}
	}
	for _, v := range slices.Backward(g.vs) {
		if mine <= share {
			break
		}
		if g.holds(v) {
			g.give(ctx, v)
			mine--
		}
	}
	for _, v := range g.vs {
		if mine >= share {
			break
		}
		if !g.holds(v) && g.take(ctx, v, now) {
			mine++
		}
	}
	return nil
}

// beat writes the member's heartbeat.
func (g *groupMember) beat(ctx context.Context, now time.Time) error {
	raw, _ := json.Marshal(lease{Member: g.opt.member, Expires: now.Add(g.opt.ttl)})
	if _, err := g.s.kv.Put(ctx, streamwal.SubscriptionMemberKey(g.s.name, g.opt.member), raw); err != nil {
		return streamwal.Errorf(streamwal.CodeUnavailable, "group %s: heartbeat of %s: %v", g.s.name, g.opt.member, err)
	}
	return nil
}

// members counts the live members of the group (this one included).
func (g *groupMember) members(ctx context.Context, now time.Time) (int, error) {
	l, err := g.s.kv.ListKeysFiltered(ctx, streamwal.SubscriptionMemberPrefix+g.s.name+".*")
	if err != nil {
		return 0, streamwal.Errorf(streamwal.CodeUnavailable, "group %s: list members: %v", g.s.name, err)
	}
	var keys []string
	for k := range l.Keys() {
		keys = append(keys, k)
	}
	n := 1
	for _, k := range keys {
		if k == streamwal.SubscriptionMemberKey(g.s.name, g.opt.member) {
			continue
		}
		if l, _, ok := g.readLease(ctx, k); ok && now.Before(l.Expires) {
			n++
		}
	}
	return n, nil
}

// readLease reads a lease (or heartbeat); ok is false when there is none.
func (g *groupMember) readLease(ctx context.Context, key string) (lease, uint64, bool) {
	e, err := g.s.kv.Get(ctx, key)
	if err != nil {
		return lease{}, 0, false
	}
	var l lease
	if json.Unmarshal(e.Value(), &l) != nil {
		return lease{}, e.Revision(), true // unreadable: anyone may take it
	}
	return l, e.Revision(), true
}

// holds reports whether the member holds v.
func (g *groupMember) holds(v streamwal.VChannel) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.leases[v]
	return ok
}

// valid reports whether the member holds v now, by its own clock.
func (g *groupMember) valid(v streamwal.VChannel) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	h, ok := g.leases[v]
	return ok && time.Now().Before(h.expires)
}

// renew extends the lease of v if the member holds it, and stops reading
// v if it lost it; it reports whether the member still holds v.
func (g *groupMember) renew(ctx context.Context, v streamwal.VChannel, now time.Time) bool {
	g.mu.Lock()
	h, ok := g.leases[v]
	g.mu.Unlock()
	if !ok {
		return false
	}
	raw, _ := json.Marshal(lease{Member: g.opt.member, Expires: now.Add(g.opt.ttl)})
	rev, err := g.s.kv.Update(ctx, streamwal.SubscriptionLeaseKey(g.s.name, v), raw, h.rev)
	if err == nil {
		g.mu.Lock()
		g.leases[v] = held{rev: rev, expires: now.Add(g.opt.ttl)}
		g.mu.Unlock()
		return true
	}
	if now.Before(h.expires) && !isWrongRevision(err) {
		return true // not renewed this time; still ours until it expires
	}
	g.s.c.opts.logger.Warn().Err(err).Str("group", g.s.name).Str("member", g.opt.member).Str("vchannel", v.String()).Msg("lease lost")
	g.drop(v)
	return false
}

// isWrongRevision reports a compare-and-set that lost to another writer.
func isWrongRevision(err error) bool {
	var apiErr *njs.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == njs.JSErrCodeStreamWrongLastSequence
}

// take leases v when it is free (never leased, given back, or expired)
// and starts reading it.
func (g *groupMember) take(ctx context.Context, v streamwal.VChannel, now time.Time) bool {
	key := streamwal.SubscriptionLeaseKey(g.s.name, v)
	raw, _ := json.Marshal(lease{Member: g.opt.member, Expires: now.Add(g.opt.ttl)})
	var rev uint64
	var err error
	switch l, lrev, ok := g.readLease(ctx, key); {
	case !ok:
		rev, err = g.s.kv.Create(ctx, key, raw)
	case l.Member != g.opt.member && now.Before(l.Expires):
		return false
	default:
		rev, err = g.s.kv.Update(ctx, key, raw, lrev)
	}
	if err != nil {
		return false // another member was faster
	}
	g.mu.Lock()
	g.leases[v] = held{rev: rev, expires: now.Add(g.opt.ttl)}
	g.mu.Unlock()
	if err := g.s.open(ctx, v); err != nil {
		g.s.c.opts.logger.Warn().Err(err).Str("group", g.s.name).Str("vchannel", v.String()).Msg("open of a leased vchannel failed")
		g.give(ctx, v)
		return false
	}
	return true
}

// drop stops reading v and forgets its lease.
func (g *groupMember) drop(v streamwal.VChannel) {
	g.mu.Lock()
	delete(g.leases, v)
	g.mu.Unlock()
	g.s.mu.Lock()
	r := g.s.readers[v]
	g.s.mu.Unlock()
	if r != nil {
		g.s.stopReader(r)
	}
}

// give stops reading v and gives its lease back, so that another member
// takes it at once.
func (g *groupMember) give(ctx context.Context, v streamwal.VChannel) {
	g.mu.Lock()
	h, ok := g.leases[v]
	g.mu.Unlock()
	g.drop(v)
	if ok {
		_ = g.s.kv.Delete(ctx, streamwal.SubscriptionLeaseKey(g.s.name, v), njs.LastRevision(h.rev))
	}
}

// release gives back every lease and the heartbeat (the subscription is
// closing).
func (g *groupMember) release() {
	ctx, cancel := context.WithTimeout(context.Background(), g.opt.ttl)
	defer cancel()
	for _, v := range g.vs {
		if g.holds(v) {
			g.give(ctx, v)
		}
	}
	_ = g.s.kv.Delete(ctx, streamwal.SubscriptionMemberKey(g.s.name, g.opt.member))
}

// guard refuses an ack on v by a group member that no longer holds v.
//
// It takes no lock of s (its callers hold a reader's, which nests inside
// s.mu): s.group is set once, before any VChannel is read.
func (s *Subscription) guard(v streamwal.VChannel) error {
	g := s.group
	if g == nil || g.valid(v) {
		return nil
	}
	return streamwal.Errorf(streamwal.CodeFenced, "group %s: member %s no longer holds %s", s.name, g.opt.member, v)
}
