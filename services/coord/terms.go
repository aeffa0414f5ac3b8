package coord

import (
	"sync"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/services/wire"
)

// termTable is the term each PChannel is assigned under, as the oracle
// reads it: the control loop raises a PChannel's term when it records an
// assignment under a new one, before the new owner hears of it, and the
// oracle refuses TimeTicks to the owners of earlier terms. Safe for
// concurrent use.
type termTable struct {
	mu    sync.RWMutex
	terms map[streamwal.PChannel]uint64
}

// newTermTable is an empty table.
func newTermTable() *termTable { return &termTable{terms: map[streamwal.PChannel]uint64{}} }

// set records that pchannel is assigned under term (never lowering it).
func (tt *termTable) set(pchannel streamwal.PChannel, term uint64) {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	tt.terms[pchannel] = max(tt.terms[pchannel], term)
}

// get is pchannel's term, and whether pchannel is known.
func (tt *termTable) get(pchannel streamwal.PChannel) (uint64, bool) {
	tt.mu.RLock()
	defer tt.mu.RUnlock()
	term, ok := tt.terms[pchannel]
	return term, ok
}

// admit refuses a TSO request of a superseded owner: one scoped to a
// PChannel under a term below the one the PChannel is assigned under. An
// unscoped request (no PChannel, no term) is admitted.
func (tt *termTable) admit(req wire.TSORequest) error {
	if req.PChannel.IsZero() && req.Term == 0 {
		return nil
	}
	if req.PChannel.IsZero() || req.Term == 0 {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "tso request scoped to pchannel %q under term %d: give both or neither", req.PChannel, req.Term)
	}
	cur, ok := tt.get(req.PChannel)
	if !ok {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "tso request for %q: not a pchannel of this cluster", req.PChannel)
	}
	if req.Term < cur {
		return streamwal.Errorf(streamwal.CodeFenced, "tso request for %s under term %d: superseded, %s is assigned under term %d", req.PChannel, req.Term, req.PChannel, cur)
	}
	return nil
}
