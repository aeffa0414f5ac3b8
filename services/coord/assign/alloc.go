package assign

import (
	"maps"
	"slices"
	"strconv"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/services/wire"
)

// allocate places a new collection's VChannels on the PChannels with the
// fewest, or answers with the ones it already has.
func (m *Machine) allocate(ev Allocate) {
	req := ev.Request
	if len(req.Adopt) > 0 {
		req.Shards, req.Lookup = len(req.Adopt), false
	}
	if req.Lookup {
		req.Shards = 1
	}
	if req.CollectionID <= 0 || req.Shards <= 0 || req.Shards > len(m.channels) {
		m.reply(ev.Call, wire.AllocateReply{}, streamwal.Errorf(streamwal.CodeInvalidArgument,
			"allocate collection %d with %d shards: want a positive id and 1 to %d shards", req.CollectionID, req.Shards, len(m.channels)))
		return
	}
	place := m.place
	if len(req.Adopt) > 0 {
		place = m.adopt
	}
	reply, next, err := place(req)
	if err != nil || next == nil {
		m.reply(ev.Call, reply, err)
		return
	}
	m.proposeCollections(*next, ev.Call, &reply)
}

// place decides an allocation: its reply, and the allocation to persist
// first (nil: none).
func (m *Machine) place(req wire.AllocateRequest) (wire.AllocateReply, *wire.Collections, error) {
	key := strconv.FormatInt(req.CollectionID, 10)
	name := ""
	if req.Name != "" {
		name = req.DBName + "." + req.Name
	}
	if vs, ok := m.alloc.Collections[key]; ok {
		if err := sameName(req.CollectionID, m.alloc.Names[key], name); err != nil {
			return wire.AllocateReply{}, nil, err
		}
		return wire.AllocateReply{VChannels: slices.Clone(vs)}, nil, nil
	}
	if have, dropped := m.alloc.Dropped[key]; dropped {
		if err := sameName(req.CollectionID, have, name); err != nil {
			return wire.AllocateReply{}, nil, err
		}
		if !req.Lookup {
			return wire.AllocateReply{}, nil, streamwal.Errorf(streamwal.CodeLifecycle,
				"collection %d: %w (collection IDs are never reused)", req.CollectionID, streamwal.ErrCollectionDropped)
		}
		return wire.AllocateReply{Dropped: true}, nil, nil
	}
	if req.Lookup {
		return wire.AllocateReply{}, nil, nil
	}
	if err := m.nameFree(req.CollectionID, name); err != nil {
		return wire.AllocateReply{}, nil, err
	}
	order := slices.Clone(m.channels)
	slices.SortStableFunc(order, func(a, b *channel) int { return m.counts[a.p] - m.counts[b.p] })
	var vs []string
	for shard := range req.Shards {
		v, err := order[shard].p.VChannel(req.CollectionID, shard)
		if err != nil {
			return wire.AllocateReply{}, nil, err
		}
		vs = append(vs, v.String())
	}
	next := cloneCollections(m.alloc)
	next.Collections[key] = vs
	if name != "" {
		next.Names[key] = name
	}
	return wire.AllocateReply{VChannels: vs}, &next, nil
}

// adopt gives a collection the VChannels of a replicated
// CreateCollection (req.Adopt): the primary's log, which a secondary
// copies, created it there, so they replace whatever the collection had
// here (a dropped one included) and its name is taken as it comes.
func (m *Machine) adopt(req wire.AllocateRequest) (wire.AllocateReply, *wire.Collections, error) {
	key := strconv.FormatInt(req.CollectionID, 10)
	for _, name := range req.Adopt {
		v, err := streamwal.ParseVChannel(name)
		if err != nil {
			return wire.AllocateReply{}, nil, err
		}
		if v.IsControl() || v.CollectionID() != req.CollectionID || m.byName[v.PChannel()] == nil {
			return wire.AllocateReply{}, nil, streamwal.Errorf(streamwal.CodeInvalidArgument,
				"adopt %s for collection %d: not a vchannel of it on this cluster's pchannels", name, req.CollectionID)
		}
	}
	name := ""
	if req.Name != "" {
		name = req.DBName + "." + req.Name
	}
	was, dropped := m.alloc.Dropped[key]
	if name == "" {
		name = was
	}
	if slices.Equal(m.alloc.Collections[key], req.Adopt) && !dropped && (name == "" || m.alloc.Names[key] == name) {
		return wire.AllocateReply{VChannels: slices.Clone(req.Adopt)}, nil, nil
	}
	next := cloneCollections(m.alloc)
	next.Collections[key] = slices.Clone(req.Adopt)
	delete(next.Dropped, key)
	if name != "" {
		next.Names[key] = name
	}
	return wire.AllocateReply{VChannels: slices.Clone(req.Adopt)}, &next, nil
}

// sameName refuses a request that names collection id otherwise than it
// was allocated (either name may be unknown: "").
func sameName(id int64, have, name string) error {
	if name != "" && have != "" && have != name {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "collection %d is %s, not %s", id, have, name)
	}
	return nil
}

// nameFree refuses a new collection id whose name ("<db>.<name>", or ""
// when unknown) a live collection already has: a name may be taken again
// once its collection is dropped, never while it lives.
func (m *Machine) nameFree(id int64, name string) error {
	if name == "" {
		return nil
	}
	for _, key := range slices.Sorted(maps.Keys(m.alloc.Names)) {
		if m.alloc.Names[key] != name {
			continue
		}
		if _, live := m.alloc.Collections[key]; live {
			return streamwal.Errorf(streamwal.CodeInvalidArgument, "collection %d: the name %s is taken by collection %s", id, name, key)
		}
	}
	return nil
}

// release forgets a dropped collection's VChannels, remembering that it
// was dropped; releasing an unknown collection changes nothing.
func (m *Machine) release(ev Release) {
	key := strconv.FormatInt(ev.CollectionID, 10)
	if _, ok := m.alloc.Collections[key]; !ok {
		m.reply(ev.Call, wire.AllocateReply{}, nil)
		return
	}
	next := cloneCollections(m.alloc)
	next.Dropped[key] = next.Names[key]
	delete(next.Collections, key)
	delete(next.Names, key)
	m.proposeCollections(next, ev.Call, &wire.AllocateReply{})
}

// reply answers a call.
func (m *Machine) reply(call uint64, r wire.AllocateReply, err error) {
	m.emit(Reply{Call: call, Allocate: r, Err: err})
}

// proposeCollections persists the allocation next; once answered, the
// call (if any) gets reply, or the persist's error.
func (m *Machine) proposeCollections(next wire.Collections, call uint64, reply *wire.AllocateReply) {
	rev := m.newRev()
	pr := &proposal{alloc: &next, call: call}
	if reply != nil {
		pr.reply = *reply
	}
	m.pending[rev] = pr
	m.emit(PersistCollections{Rev: rev, Collections: cloneCollections(next)})
}

// answeredCollections takes in the answer to the allocation's persist.
func (m *Machine) answeredCollections(pr *proposal, err error) {
	if err == nil {
		m.alloc = *pr.alloc
		m.countVChannels()
		m.dirty = true
	}
	if pr.call == 0 {
		return
	}
	if err != nil {
		pr.reply = wire.AllocateReply{}
	}
	m.reply(pr.call, pr.reply, err)
}

// countVChannels recomputes each PChannel's VChannel count (names that do
// not parse, or of other PChannels, count nowhere).
func (m *Machine) countVChannels() {
	clear(m.counts)
	for _, vs := range m.alloc.Collections {
		for _, name := range vs {
			if v, err := streamwal.ParseVChannel(name); err == nil && m.byName[v.PChannel()] != nil {
				m.counts[v.PChannel()]++
			}
		}
	}
}

// cloneCollections is a deep copy of c with its maps made.
func cloneCollections(c wire.Collections) wire.Collections {
	out := c
	out.Collections = make(map[string][]string, len(c.Collections))
	for k, vs := range c.Collections {
		out.Collections[k] = slices.Clone(vs)
	}
	out.Names = maps.Clone(c.Names)
	if out.Names == nil {
		out.Names = map[string]string{}
	}
	out.Dropped = maps.Clone(c.Dropped)
	if out.Dropped == nil {
		out.Dropped = map[string]string{}
	}
	return out
}
