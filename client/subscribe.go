package client

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/read"
	"github.com/streamwal/streamwal/services/wire"
)

// SubscribeOption configures Subscribe.
type SubscribeOption func(*subscribeOptions)

// subscribeOptions are Subscribe's settings.
type subscribeOptions struct {
	vchannel   streamwal.VChannel
	collection int64
	start      Start
	types      []*messages.Type
	buffer     int
	expiry     time.Duration
	group      *groupOptions // nil: not a group
	leaseTTL   time.Duration
}

// SubscribeVChannel subscribes to one VChannel.
func SubscribeVChannel(v streamwal.VChannel) SubscribeOption {
	return func(o *subscribeOptions) { o.vchannel = v }
}

// SubscribeCollection subscribes to every VChannel of collection id.
func SubscribeCollection(id int64) SubscribeOption {
	return func(o *subscribeOptions) { o.collection = id }
}

// SubscribeStart is where a new subscription starts: Earliest (the
// default), Latest (what is appended after it is created), AtTimeTick or
// AtTime, From or After a MessageID. A subscription that exists resumes
// from its acknowledged position instead.
func SubscribeStart(s Start) SubscribeOption { return func(o *subscribeOptions) { o.start = s } }

// SubscribeTypes delivers only these types (see ReadOptions.Types).
func SubscribeTypes(types ...*messages.Type) SubscribeOption {
	return func(o *subscribeOptions) { o.types = append(o.types, types...) }
}

// SubscribeExpiry is how long the subscription's positions hold the log
// while nothing is acknowledged (default DefaultSubscriptionExpiry;
// negative: forever). Past it, the owner of a PChannel may truncate the
// log past the position.
func SubscribeExpiry(d time.Duration) SubscribeOption {
	return func(o *subscribeOptions) { o.expiry = d }
}

// SubscribeBuffer bounds the messages read ahead of Next (default 256).
func SubscribeBuffer(n int) SubscribeOption { return func(o *subscribeOptions) { o.buffer = n } }

// subscriptionRecord is the stored value of streamwal.SubscriptionKey.
type subscriptionRecord struct {
	Name       string    `json:"name"`
	VChannel   string    `json:"vchannel,omitempty"`
	Collection int64     `json:"collection,omitempty"`
	Group      bool      `json:"group,omitempty"`
	Created    time.Time `json:"created"`
}

// sameTarget reports whether r and o subscribe to the same thing.
func (r subscriptionRecord) sameTarget(o subscriptionRecord) bool {
	return r.VChannel == o.VChannel && r.Collection == o.Collection && r.Group == o.Group
}

// Position is a durable subscription's acknowledged position on one
// VChannel, as stored in the subscriptions bucket.
type Position struct {
	// VChannel is the VChannel it is about.
	VChannel string `json:"vchannel"`
	// From is where a resumed read starts: the LastConfirmedMessageID of
	// the last acknowledged message, so that transactions open there are
	// read whole (or, before the first acknowledgement, where the
	// subscription started; 0: the earliest message of the log). The log
	// is kept from here on (see the node's truncation).
	From messages.MessageID `json:"from"`
	// TimeTick is the last acknowledged message's: a resumed read
	// delivers only messages above it (0: none acknowledged, or the
	// subscription starts at a TimeTick above it).
	TimeTick messages.TimeTick `json:"timetick"`
	// ID is the last acknowledged message's (0: none).
	ID messages.MessageID `json:"id"`
	// Acked is when it was last acknowledged (or created).
	Acked time.Time `json:"acked"`
	// Expiry is how long it may stay unacknowledged and still hold the
	// log (see SubscribeExpiry; 0: the node's default, negative:
	// forever).
	Expiry time.Duration `json:"expiry,omitempty"`
}

// The position's stored form is the one the nodes read.
var _ = Position(wire.SubscriptionPosition{})

// DefaultSubscriptionExpiry is how long a subscription's position holds
// the log without an acknowledgement, unless SubscribeExpiry says
// otherwise: past it, the PChannel's owner truncates past the position
// (and logs it), and a resume may find its position lost.
const DefaultSubscriptionExpiry = 7 * 24 * time.Hour

// Expired reports whether p stopped holding the log at now: idle past its
// expiry.
func (p Position) Expired(now time.Time) bool {
	return p.Expiry > 0 && now.Sub(p.Acked) > p.Expiry
}

// subscriptionsKV opens the cluster's subscriptions bucket (which the
// coordinator provisions).
func (c *Client) subscriptionsKV(ctx context.Context) (njs.KeyValue, error) {
	c.mu.Lock()
	kv := c.subsKV
	c.mu.Unlock()
	if kv != nil {
		return kv, nil
	}
	js, err := njs.New(c.nc)
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeUnavailable, "jetstream: %v", err)
	}
	name := c.opts.cluster.BucketName(streamwal.BucketSubscriptions)
	kv, err = js.KeyValue(ctx, name)
	if errors.Is(err, njs.ErrBucketNotFound) {
		return nil, streamwal.Errorf(streamwal.CodeUnavailable, "no bucket %s: the cluster's coordinator has not provisioned it (an older version?)", name)
	}
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeUnavailable, "open bucket %s: %v", name, err)
	}
	c.mu.Lock()
	c.subsKV = kv
	c.mu.Unlock()
	return kv, nil
}

// Subscription is a durable subscription: a reader whose position is
// acknowledged by its handler and kept in the cluster, so that it resumes
// where it left off after a restart. Next delivers messages in TimeTick
// order per VChannel (no order holds across VChannels), transactions
// assembled; Delivery.Ack acknowledges a message and every message
// delivered before it on its VChannel. Delivery is at least once: after
// a restart, exactly what was not acknowledged is delivered again. It is
// safe for concurrent use.
type Subscription struct {
	c    *Client
	name string
	kv   njs.KeyValue
	opts subscribeOptions

	out    chan *Delivery
	errc   chan error
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	readers map[streamwal.VChannel]*vreader
	closed  bool
	group   *groupMember // nil unless a group member
}

// vreader reads one VChannel of a subscription.
type vreader struct {
	v      streamwal.VChannel
	cancel context.CancelFunc
	done   chan struct{}

	mu  sync.Mutex // guards pos and rev
	pos Position
	rev uint64
	// gen counts the times the VChannel was (re)opened: a delivery of an
	// earlier reading of it is stale (a group handed it away meanwhile).
	gen uint64
}

// Delivery is one message of a durable subscription.
type Delivery struct {
	// Message is the message (a committed transaction arrives as one Txn).
	Message *messages.ImmutableMessage
	// VChannel is the subscribed VChannel it was read from.
	VChannel streamwal.VChannel
	sub      *Subscription
	r        *vreader
	gen      uint64
}

// Ack acknowledges the message and every message delivered before it on
// its VChannel: the subscription's stored position moves past it, so
// that it is not delivered again. Acknowledging less often (every 100
// messages, say) costs less and redelivers more after a crash. An ack
// older than the stored position changes nothing.
func (d *Delivery) Ack(ctx context.Context) error { return d.sub.ack(ctx, d) }

// Subscribe opens (or creates) the durable subscription name on a
// VChannel (SubscribeVChannel) or a collection (SubscribeCollection). A
// new subscription starts where SubscribeStart says (Earliest by
// default); one that exists resumes after its last acknowledged message,
// from that message's LastConfirmedMessageID, so that a transaction open
// there is delivered whole. A name already used for another target is an
// invalid argument. A position older than what the log still holds (its
// stream truncated and no archive of it) is streamwal.ErrPositionLost.
// Close the subscription when done; its position stays in the cluster
// until DeleteSubscription.
func (c *Client) Subscribe(ctx context.Context, name string, opts ...SubscribeOption) (*Subscription, error) {
	o, err := subscribeConfig(name, opts)
	if err != nil {
		return nil, err
	}
	kv, err := c.subscriptionsKV(ctx)
	if err != nil {
		return nil, err
	}
	vs, err := c.subscriptionTargets(ctx, o)
	if err != nil {
		return nil, err
	}
	rec := subscriptionRecord{Name: name, VChannel: vchannelName(o.vchannel), Collection: o.collection,
		Group: o.group != nil, Created: time.Now().UTC()}
	if err := c.registerSubscription(ctx, kv, rec); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	s := &Subscription{c: c, name: name, kv: kv, opts: o, out: make(chan *Delivery, o.buffer), errc: make(chan error, 1),
		ctx: sctx, cancel: cancel, readers: map[streamwal.VChannel]*vreader{}}
	if err := c.track(s); err != nil {
		cancel()
		return nil, err
	}
	s.wg.Add(1)
	go s.keepAlive()
	if o.group != nil {
		if err := s.joinGroup(ctx, vs); err != nil {
			s.Close()
			return nil, err
		}
		return s, nil
	}
	for _, v := range vs {
		if err := s.open(ctx, v); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// track registers s, so that Close closes it.
func (c *Client) track(s *Subscription) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errClosed()
	}
	if c.subs == nil {
		c.subs = map[*Subscription]struct{}{}
	}
	c.subs[s] = struct{}{}
	return nil
}

// keepAliveMax bounds the period of keepAlive.
const keepAliveMax = time.Minute

// keepAlive rewrites the positions of the VChannels s reads with a new
// Acked time, a quarter of its expiry apart (at most a minute): a
// subscription that is open is not idle, even when nothing arrives to be
// acknowledged, and its positions keep holding the log.
func (s *Subscription) keepAlive() {
	defer s.wg.Done()
	if s.opts.expiry < 0 {
		return
	}
	t := time.NewTicker(min(s.opts.expiry/4, keepAliveMax))
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		readers := make([]*vreader, 0, len(s.readers))
		for _, r := range s.readers {
			readers = append(readers, r)
		}
		s.mu.Unlock()
		for _, r := range readers {
			s.refresh(r)
		}
	}
}

// refresh rewrites r's position with a new Acked time while r is read.
func (s *Subscription) refresh(r *vreader) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel == nil || s.guard(r.v) != nil {
		return // not read here (any more)
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.c.opts.timeout)
	defer cancel()
	pos := r.pos
	pos.Acked = time.Now().UTC()
	if rev, stored, err := s.store(ctx, r.v, pos, r.rev); err == nil {
		r.pos, r.rev = stored, rev
	}
}

// subscribeConfig validates name and opts.
func subscribeConfig(name string, opts []SubscribeOption) (subscribeOptions, error) {
	o := subscribeOptions{start: Earliest(), buffer: 256, expiry: DefaultSubscriptionExpiry}
	for _, f := range opts {
		f(&o)
	}
	if err := streamwal.CheckSubscriptionName(name); err != nil {
		return o, err
	}
	if o.vchannel.IsZero() == (o.collection == 0) {
		return o, streamwal.Errorf(streamwal.CodeInvalidArgument, "subscription %s needs one VChannel or one collection", name)
	}
	if err := checkGroup(name, o.group, o.leaseTTL); err != nil {
		return o, err
	}
	if o.collection < 0 || o.buffer <= 0 || o.expiry == 0 {
		return o, streamwal.Errorf(streamwal.CodeInvalidArgument, "subscription %s: collection, buffer and expiry must be positive (a negative expiry: never)", name)
	}
	return o, nil
}

// vchannelName is v's name, "" for none.
func vchannelName(v streamwal.VChannel) string {
	if v.IsZero() {
		return ""
	}
	return v.String()
}

// subscriptionTargets are the VChannels o subscribes to.
func (c *Client) subscriptionTargets(ctx context.Context, o subscribeOptions) ([]streamwal.VChannel, error) {
	if !o.vchannel.IsZero() {
		if err := c.CheckPChannel(ctx, o.vchannel.PChannel()); err != nil {
			return nil, err
		}
		return []streamwal.VChannel{o.vchannel}, nil
	}
	return c.CollectionVChannels(ctx, o.collection)
}

// registerSubscription creates rec, or checks that the stored record has
// the same target.
func (c *Client) registerSubscription(ctx context.Context, kv njs.KeyValue, rec subscriptionRecord) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return streamwal.Errorf(streamwal.CodeInternal, "encode subscription %s: %v", rec.Name, err)
	}
	key := streamwal.SubscriptionKey(rec.Name)
	_, err = kv.Create(ctx, key, raw)
	if err == nil {
		return nil
	}
	if !errors.Is(err, njs.ErrKeyExists) {
		return streamwal.Errorf(streamwal.CodeUnavailable, "create subscription %s: %v", rec.Name, err)
	}
	stored, err := readSubscription(ctx, kv, rec.Name)
	if err != nil {
		return err
	}
	if !stored.sameTarget(rec) {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "subscription %s exists for %s, not %s (delete it first)",
			rec.Name, stored.target(), rec.target())
	}
	return nil
}

// target describes what r subscribes to.
func (r subscriptionRecord) target() string {
	what := "vchannel " + r.VChannel
	if r.Collection != 0 {
		what = "collection " + itoa(r.Collection)
	}
	if r.Group {
		what = "group on " + what
	}
	return what
}

// readSubscription reads subscription name's record.
func readSubscription(ctx context.Context, kv njs.KeyValue, name string) (subscriptionRecord, error) {
	var rec subscriptionRecord
	e, err := kv.Get(ctx, streamwal.SubscriptionKey(name))
	if errors.Is(err, njs.ErrKeyNotFound) {
		return rec, streamwal.Errorf(streamwal.CodeInvalidArgument, "%s: %w", name, streamwal.ErrSubscriptionNotFound)
	}
	if err != nil {
		return rec, streamwal.Errorf(streamwal.CodeUnavailable, "read subscription %s: %v", name, err)
	}
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return rec, streamwal.Errorf(streamwal.CodeUnrecoverable, "subscription %s does not decode: %v", name, err)
	}
	return rec, nil
}

// position reads (or, the first time, creates from the start option) the
// subscription's position on v, with its revision.
func (s *Subscription) position(ctx context.Context, v streamwal.VChannel) (Position, uint64, error) {
	key := streamwal.SubscriptionPositionKey(s.name, v)
	for {
		e, err := s.kv.Get(ctx, key)
		if err == nil {
			var pos Position
			if err := json.Unmarshal(e.Value(), &pos); err != nil {
				return Position{}, 0, streamwal.Errorf(streamwal.CodeUnrecoverable, "%s does not decode: %v", key, err)
			}
			return pos, e.Revision(), nil
		}
		if !errors.Is(err, njs.ErrKeyNotFound) {
			return Position{}, 0, streamwal.Errorf(streamwal.CodeUnavailable, "read %s: %v", key, err)
		}
		pos, err := s.c.startPosition(ctx, v, s.opts.start)
		if err != nil {
			return Position{}, 0, err
		}
		pos.Expiry = s.opts.expiry
		raw, _ := json.Marshal(pos)
		rev, err := s.kv.Create(ctx, key, raw)
		if err == nil {
			return pos, rev, nil
		}
		if !errors.Is(err, njs.ErrKeyExists) {
			return Position{}, 0, streamwal.Errorf(streamwal.CodeUnavailable, "create %s: %v", key, err)
		}
		// Another instance created it first: read theirs.
	}
}

// startPosition resolves where a new subscription on v starts.
func (c *Client) startPosition(ctx context.Context, v streamwal.VChannel, st Start) (Position, error) {
	pos := Position{VChannel: v.String(), Acked: time.Now().UTC()}
	p := v.PChannel()
	if st.s.TimeTick != 0 {
		at, err := read.Locate(ctx, c.backend, p, st.s.TimeTick)
		if err != nil {
			return Position{}, err
		}
		pos.From, pos.TimeTick = firstID(at), st.s.TimeTick-1
		return pos, nil
	}
	switch st.s.Position.Kind {
	case jetstream.StartLatest:
		last, err := c.backend.Last(ctx, p)
		if err != nil {
			return Position{}, err
		}
		pos.From = last + 1
	case jetstream.StartFrom, jetstream.StartAfter:
		pos.From = firstID(st.s.Position)
	}
	return pos, nil
}

// firstID is the first MessageID a start position reads.
func firstID(s jetstream.StartPosition) messages.MessageID {
	switch s.Kind {
	case jetstream.StartFrom:
		return max(s.ID, 1)
	case jetstream.StartAfter:
		return s.ID + 1
	}
	return 0
}

// open starts reading v from the subscription's position on it.
func (s *Subscription) open(ctx context.Context, v streamwal.VChannel) error {
	pos, rev, err := s.position(ctx, v)
	if err != nil {
		return err
	}
	if err := s.c.checkPosition(ctx, s.name, v, pos); err != nil {
		return err
	}
	ro, err := s.c.readOptions(v, streamwal.PChannel{}, resumeStart(pos), s.opts.types, resumeAbove(pos))
	if err != nil {
		return err
	}
	sc, err := read.Open(ctx, ro)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithCancel(s.ctx)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		cancel()
		_ = sc.Close()
		return errClosedSubscription(s.name)
	}
	r := s.readers[v]
	if r == nil {
		r = &vreader{v: v}
		s.readers[v] = r
	}
	r.mu.Lock()
	r.pos, r.rev, r.cancel, r.done = pos, rev, cancel, make(chan struct{})
	r.gen++
	gen, done := r.gen, r.done
	r.mu.Unlock()
	s.wg.Add(1)
	s.mu.Unlock()
	go s.pump(rctx, r, gen, sc, done)
	return nil
}

// resumeStart is where a read resumes from pos.
func resumeStart(pos Position) Start {
	if pos.From == 0 {
		return Earliest()
	}
	return From(pos.From)
}

// resumeAbove is the smallest TimeTick a read resumed from pos delivers.
func resumeAbove(pos Position) messages.TimeTick {
	if pos.TimeTick == 0 {
		return 0
	}
	return pos.TimeTick + 1
}

// checkPosition refuses a position the log no longer holds: below the
// stream's first message and not in its archive either.
func (c *Client) checkPosition(ctx context.Context, name string, v streamwal.VChannel, pos Position) error {
	if pos.From <= 1 {
		return nil
	}
	st, err := c.backend.State(ctx, v.PChannel())
	if err != nil || st.Messages == 0 || pos.From >= st.First {
		return nil // an unreadable state is the read's to report
	}
	_, err = c.backend.Get(ctx, v.PChannel(), pos.From)
	if errors.Is(err, jetstream.ErrNotStored) {
		return streamwal.Errorf(streamwal.CodeUnrecoverable, "subscription %s on %s resumes at %d, but the log starts at %d: %w",
			name, v, pos.From, st.First, streamwal.ErrPositionLost)
	}
	return nil
}

// pump moves what sc delivers to the subscription's Next until ctx ends.
func (s *Subscription) pump(ctx context.Context, r *vreader, gen uint64, sc *read.Scanner, done chan struct{}) {
	defer s.wg.Done()
	defer close(done)
	defer func() { _ = sc.Close() }()
	for {
		m, err := sc.Next(ctx)
		if err != nil {
			if ctx.Err() == nil {
				s.fail(streamwal.Errorf(streamwal.CodeOf(err), "subscription %s on %s: %w", s.name, r.v, err))
			}
			return
		}
		select {
		case s.out <- &Delivery{Message: m, VChannel: r.v, sub: s, r: r, gen: gen}:
		case <-ctx.Done():
			return
		}
	}
}

// fail hands err to Next (the first error only).
func (s *Subscription) fail(err error) {
	select {
	case s.errc <- err:
	default:
	}
}

// Name is the subscription's name.
func (s *Subscription) Name() string { return s.name }

// Next blocks for the next message, until ctx ends or the subscription
// is closed (streamwal.ErrClosed) or fails. The client's hooks are told
// of each message delivered (telemetry.ConsumeHook: a wal.dist_consume
// span under ctx's).
func (s *Subscription) Next(ctx context.Context) (*Delivery, error) {
	for {
		d, err := s.next(ctx)
		if err != nil {
			return nil, err
		}
		if !d.stale() {
			noteConsume(ctx, s.c.opts.hooks, d.Message)
			return d, nil
		}
	}
}

// stale reports whether d was read before its VChannel was handed to
// another group member (or read again): it is not delivered.
func (d *Delivery) stale() bool {
	d.r.mu.Lock()
	defer d.r.mu.Unlock()
	return d.gen != d.r.gen
}

// next takes what the readers delivered.
func (s *Subscription) next(ctx context.Context) (*Delivery, error) {
	if s.ctx.Err() != nil {
		return nil, errClosedSubscription(s.name) // what is buffered stays undelivered
	}
	select {
	case d := <-s.out:
		return d, nil
	case err := <-s.errc:
		s.fail(err) // every later Next fails alike
		return nil, err
	case <-s.ctx.Done():
		return nil, errClosedSubscription(s.name)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// errClosedSubscription is the error of a closed subscription.
func errClosedSubscription(name string) error {
	return streamwal.Errorf(streamwal.CodeClosed, "subscription %s is closed", name)
}

// ack stores d's position on its VChannel, unless a later one is stored.
func (s *Subscription) ack(ctx context.Context, d *Delivery) error {
	m := d.Message
	r := d.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if d.gen != r.gen {
		return streamwal.Errorf(streamwal.CodeFenced, "subscription %s: %s was handed to another member since this message was delivered", s.name, d.VChannel)
	}
	if m.TimeTick() <= r.pos.TimeTick {
		return nil
	}
	if err := s.guard(d.VChannel); err != nil {
		return err
	}
	next := Position{VChannel: d.VChannel.String(), From: max(min(m.LastConfirmed(), m.ID()), 1), TimeTick: m.TimeTick(),
		ID: m.ID(), Acked: time.Now().UTC(), Expiry: s.opts.expiry}
	rev, stored, err := s.store(ctx, d.VChannel, next, r.rev)
	if err != nil {
		return err
	}
	r.pos, r.rev = stored, rev
	return nil
}

// store writes pos as the position on v over revision rev; when another
// writer moved it meanwhile, the later of the two is kept. It returns the
// stored position and its revision.
func (s *Subscription) store(ctx context.Context, v streamwal.VChannel, pos Position, rev uint64) (uint64, Position, error) {
	key := streamwal.SubscriptionPositionKey(s.name, v)
	raw, _ := json.Marshal(pos)
	for {
		n, err := s.kv.Update(ctx, key, raw, rev)
		if err == nil {
			return n, pos, nil
		}
		if ctx.Err() != nil {
			return 0, Position{}, streamwal.Errorf(streamwal.CodeUnknownOutcome, "ack of %s on %s: %w", s.name, v, ctx.Err())
		}
		e, gerr := s.kv.Get(ctx, key)
		if gerr != nil {
			return 0, Position{}, streamwal.Errorf(streamwal.CodeUnavailable, "ack of %s on %s: %v (then %v)", s.name, v, err, gerr)
		}
		var cur Position
		if jerr := json.Unmarshal(e.Value(), &cur); jerr == nil && cur.TimeTick >= pos.TimeTick {
			return e.Revision(), cur, nil
		}
		rev = e.Revision()
	}
}

// Positions are the subscription's positions as it last stored or read
// them, one per VChannel it reads.
func (s *Subscription) Positions() []Position {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Position, 0, len(s.readers))
	for _, r := range s.readers {
		r.mu.Lock()
		if r.cancel != nil {
			out = append(out, r.pos)
		}
		r.mu.Unlock()
	}
	return out
}

// stopReader stops reading r's VChannel and waits for its reader.
func (s *Subscription) stopReader(r *vreader) {
	r.mu.Lock()
	cancel, done := r.cancel, r.done
	r.cancel = nil
	r.gen++
	r.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// Close stops the subscription. Its position stays in the cluster; what
// was delivered and not acknowledged is delivered again to the next
// Subscribe of its name.
func (s *Subscription) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	g := s.group
	s.mu.Unlock()
	s.c.mu.Lock()
	delete(s.c.subs, s)
	s.c.mu.Unlock()
	if g != nil {
		g.stop()
	}
	s.cancel()
	s.wg.Wait()
	if g != nil {
		g.release()
	}
	return nil
}
