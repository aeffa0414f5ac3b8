package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/services/wire"
)

// readiness is what a node knows of its assignments: the term the
// coordinator last asked it to open each PChannel under (from the
// requests it answered), until it closed it or a newer owner fenced it;
// and what it heard of the active coordinator, whose lease and
// assignment view it watches.
type readiness struct {
	mu       sync.Mutex
	wanted   map[streamwal.PChannel]uint64
	lastBeat time.Time // of the last heartbeat written
	beatErr  error     // of the last heartbeat that failed

	leaseTTL time.Duration // of the lease bucket (0 before it was read)
	holder   string        // the lease's holder ("" while none)
	renewed  time.Time     // when the lease was last written, as heard
	view     *wire.View    // the last view published (nil before one)
	watchErr error         // why the lease or the view cannot be watched
}

// want records that the coordinator asked for p under term.
func (r *readiness) want(p streamwal.PChannel, term uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.wanted == nil {
		r.wanted = map[streamwal.PChannel]uint64{}
	}
	if term >= r.wanted[p] {
		r.wanted[p] = term
	}
}

// unwant records that p is no longer assigned here at or below term (0:
// any term).
func (r *readiness) unwant(p streamwal.PChannel, term uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.wanted[p]; ok && (term == 0 || t <= term) {
		delete(r.wanted, p)
	}
}

// beat records a heartbeat's outcome.
func (r *readiness) beat(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.beatErr = err
	if err == nil {
		r.lastBeat = time.Now()
	}
}

// heardLease records a write of the lease (holder "" when it was
// deleted).
func (r *readiness) heardLease(holder string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.holder, r.renewed, r.watchErr = holder, time.Now(), nil
}

// heardView records a view the coordinator published.
func (r *readiness) heardView(v *wire.View) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.view, r.watchErr = v, nil
}

// watchFailed records why the lease or the view cannot be watched.
func (r *readiness) watchFailed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.watchErr = err
}

// readyState is a copy of what Ready judges by.
type readyState struct {
	lastBeat time.Time
	beatErr  error
	wanted   map[streamwal.PChannel]uint64
	leaseTTL time.Duration
	holder   string
	renewed  time.Time
	view     *wire.View
	watchErr error
}

// state copies r.
func (r *readiness) state() readyState {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := readyState{lastBeat: r.lastBeat, beatErr: r.beatErr, wanted: make(map[streamwal.PChannel]uint64, len(r.wanted)),
		leaseTTL: r.leaseTTL, holder: r.holder, renewed: r.renewed, view: r.view, watchErr: r.watchErr}
	for p, t := range r.wanted {
		s.wanted[p] = t
	}
	return s
}

// ErrNotReady is wrapped by Ready's errors.
var ErrNotReady = errors.New("not ready")

// Ready reports whether the node serves what it is assigned, as heard
// from an active coordinator:
//   - its last heartbeat was written within four heartbeat periods;
//   - a coordinator holds the lease (its last renewal was heard within
//     the lease's TTL), so a node that cannot reach any coordinator, or
//     whose coordinators are all down, is not ready;
//   - that coordinator published a view of the assignments, which lists
//     this node among the live ones (it has seen this node);
//   - the node serves, under the term assigned, every PChannel that view
//     assigns to it (ASSIGNING or ASSIGNED) and every PChannel the
//     coordinator asked it to open since, unless closed since or fenced
//     by a newer owner; a PChannel whose open failed, or whose WAL
//     failed, keeps it unready until the coordinator reopens or moves it;
//   - no PChannel of the view waits for an owner (UNAVAILABLE, or never
//     assigned): the coordinator is about to hand it out, perhaps to
//     this node. A node that restarted lost its PChannels, which wait so
//     until they are assigned again, and is not ready before; a spare is
//     ready once every PChannel has an owner. A PChannel no node can
//     open (one refused for lost history) keeps every node unready until
//     an operator acts, as it keeps `serve` (embedded/system) unready.
func (n *Node) Ready() error {
	s := n.ready.state()
	if age := time.Since(s.lastBeat); age > 4*n.cfg.Heartbeat {
		return fmt.Errorf("%w: node %s has not written a heartbeat for %s (last error: %v)", ErrNotReady, n.cfg.ID, age.Round(time.Millisecond), s.beatErr)
	}
	if err := n.heardCoordinator(s); err != nil {
		return fmt.Errorf("%w: node %s: %w", ErrNotReady, n.cfg.ID, err)
	}
	mine, elsewhere, unowned := n.assignedInView(s.view)
	for p, term := range mine {
		if term > s.wanted[p] {
			s.wanted[p] = term
		}
	}
	var missing []string
	for p, term := range s.wanted {
		if elsewhere[p] > term {
			continue // assigned since to another node, which fences this one
		}
		if !n.serves(p, term) {
			missing = append(missing, fmt.Sprintf("%s (term %d)", p, term))
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return fmt.Errorf("%w: node %s does not yet serve %s, assigned to it", ErrNotReady, n.cfg.ID, strings.Join(missing, ", "))
	}
	if len(unowned) > 0 {
		slices.Sort(unowned)
		return fmt.Errorf("%w: node %s: %s wait for an owner, perhaps this node", ErrNotReady, n.cfg.ID, strings.Join(unowned, ", "))
	}
	return nil
}

// serves reports whether the node serves p under term, without waiting
// for the WAL (whose lock a sync round may hold while the coordinator's
// oracle does not answer): a WAL that stopped is done.
func (n *Node) serves(p streamwal.PChannel, term uint64) bool {
	w, ok := n.WAL(p)
	if !ok || w.Term() != term {
		return false
	}
	select {
	case <-w.Done():
		return false
	default:
		return true
	}
}

// heardCoordinator says why s does not show an active coordinator that
// has seen this node, if it does not.
func (n *Node) heardCoordinator(s readyState) error {
	switch {
	case s.holder == "" && s.watchErr != nil:
		return fmt.Errorf("cannot watch the coordinator's lease and assignments: %w", s.watchErr)
	case s.holder == "":
		return errors.New("no coordinator holds the lease")
	case s.leaseTTL > 0 && time.Since(s.renewed) > s.leaseTTL:
		return fmt.Errorf("the lease of coordinator %s was not renewed for %s", s.holder, time.Since(s.renewed).Round(time.Millisecond))
	case s.view == nil || s.view.Leader != s.holder:
		return fmt.Errorf("coordinator %s has not yet published its assignments", s.holder)
	case !slices.Contains(s.view.Nodes, string(n.cfg.ID)):
		return fmt.Errorf("coordinator %s has not yet seen this node", s.holder)
	}
	return nil
}

// assignedInView returns the PChannels v assigns to this node (ASSIGNING
// or ASSIGNED) and those it assigns to others, with their terms, and
// names those that wait for an owner.
func (n *Node) assignedInView(v *wire.View) (mine, elsewhere map[streamwal.PChannel]uint64, unowned []string) {
	mine, elsewhere = map[streamwal.PChannel]uint64{}, map[streamwal.PChannel]uint64{}
	if v == nil {
		return mine, elsewhere, nil
	}
	for _, a := range v.Channels {
		p, err := streamwal.ParsePChannel(a.PChannel)
		if err != nil {
			continue
		}
		switch {
		case a.Node == "":
			unowned = append(unowned, fmt.Sprintf("%s (%s)", a.PChannel, a.State))
		case a.Node != string(n.cfg.ID):
			elsewhere[p] = a.Term
		case a.State == wire.Assigning || a.State == wire.Assigned:
			mine[p] = a.Term
		}
	}
	return mine, elsewhere, unowned
}

// coordinatorRetry is how long the node waits before it watches the
// coordinator's lease and view again, after a failure.
const coordinatorRetry = time.Second

// watchCoordinator follows the coordinator's lease and assignment view,
// for Ready, until the node stops.
func (n *Node) watchCoordinator() {
	defer n.loops.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-n.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	js, err := njs.New(n.cfg.Conn)
	if err != nil {
		n.ready.watchFailed(err)
		return
	}
	warned := false
	follow(ctx, coordinatorRetry, func(ctx context.Context) error { return n.followCoordinator(ctx, js) }, func(err error) {
		n.ready.watchFailed(err)
		if !warned {
			n.log.Warn().Err(err).Msg("cannot watch the coordinator's lease and assignments: the node is not ready; trying again")
			warned = true
		}
	})
}

// follow runs watch until ctx ends, again after retry each time it
// fails, telling failed of each failure.
func follow(ctx context.Context, retry time.Duration, watch func(context.Context) error, failed func(error)) {
	for ctx.Err() == nil {
		err := watch(ctx)
		if ctx.Err() != nil {
			return
		}
		failed(err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
	}
}

// followCoordinator watches the lease and the view until ctx ends or a
// watch fails.
func (n *Node) followCoordinator(ctx context.Context, js njs.JetStream) error {
	c := n.cfg.Codec.Cluster()
	leader, err := js.KeyValue(ctx, c.BucketName(streamwal.BucketLeader))
	if err != nil {
		return fmt.Errorf("lease bucket: %w", err)
	}
	st, err := leader.Status(ctx)
	if err != nil {
		return fmt.Errorf("lease bucket: %w", err)
	}
	n.ready.mu.Lock()
	n.ready.leaseTTL = st.TTL()
	n.ready.mu.Unlock()
	assignments, err := js.KeyValue(ctx, c.BucketName(streamwal.BucketAssignments))
	if err != nil {
		return fmt.Errorf("assignments bucket: %w", err)
	}
	lease, err := leader.Watch(ctx, streamwal.KeyLeader)
	if err != nil {
		return fmt.Errorf("watch the lease: %w", err)
	}
	defer func() { _ = lease.Stop() }()
	view, err := assignments.Watch(ctx, streamwal.KeyView)
	if err != nil {
		return fmt.Errorf("watch the assignments: %w", err)
	}
	defer func() { _ = view.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-lease.Updates():
			if !ok {
				return errors.New("the watch of the lease ended")
			}
			if e == nil {
				continue // the end of the initial values
			}
			holder := ""
			if e.Operation() == njs.KeyValuePut {
				holder = string(e.Value())
			}
			n.ready.heardLease(holder)
		case e, ok := <-view.Updates():
			if !ok {
				return errors.New("the watch of the assignments ended")
			}
			if e == nil || e.Operation() != njs.KeyValuePut {
				continue
			}
			var v wire.View
			if err := json.Unmarshal(e.Value(), &v); err != nil {
				n.log.Warn().Err(err).Msg("undecodable assignment view")
				continue
			}
			n.ready.heardView(&v)
		}
	}
}
