package streamwal

// The names that cross the wire (PChannel, VChannel, NodeID) travel in
// JSON as their names and validate themselves when decoded: a request
// that carries a bad name is refused with CodeInvalidArgument as it is
// decoded, and its handler gets names it need not parse again. The empty
// name is the zero value, as String gives it.

// MarshalText returns p's name ("" for the zero value).
func (p PChannel) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText parses a PChannel name (see ParsePChannel); "" is the zero
// value. A bad name is CodeInvalidArgument.
func (p *PChannel) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*p = PChannel{}
		return nil
	}
	q, err := ParsePChannel(string(b))
	if err != nil {
		return err
	}
	*p = q
	return nil
}

// MarshalText returns v's name ("" for the zero value).
func (v VChannel) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// UnmarshalText parses a VChannel name (see ParseVChannel); "" is the zero
// value. A bad name is CodeInvalidArgument.
func (v *VChannel) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*v = VChannel{}
		return nil
	}
	w, err := ParseVChannel(string(b))
	if err != nil {
		return err
	}
	*v = w
	return nil
}

// MarshalText returns the node ID.
func (n NodeID) MarshalText() ([]byte, error) { return []byte(n), nil }

// UnmarshalText validates a node ID (see ParseNodeID); "" is the zero
// value. A bad ID is CodeInvalidArgument.
func (n *NodeID) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*n = ""
		return nil
	}
	id, err := ParseNodeID(string(b))
	if err != nil {
		return err
	}
	*n = id
	return nil
}
