package messages

// txnParts are the messages of a committed transaction.
type txnParts struct {
	begin  *ImmutableMessage
	body   []*ImmutableMessage
	commit *ImmutableMessage
}

// NewTxnMessage assembles a committed transaction into one synthetic message
// of type [TypeTxn]. It takes the CommitTxn's MessageID, TimeTick and
// LastConfirmed, so a reader sees the transaction at its commit. All parts
// must share one VChannel and TxnID; the body must be body-capable types.
func NewTxnMessage(begin *ImmutableMessage, body []*ImmutableMessage, commit *ImmutableMessage) (*ImmutableMessage, error) {
	if begin == nil || commit == nil || begin.typ != TypeBeginTxn || commit.typ != TypeCommitTxn {
		return nil, wrapInvalid(ErrMalformed, "transaction needs a BeginTxn and a CommitTxn")
	}
	if begin.h.Txn == nil || commit.h.Txn == nil || begin.h.Txn.ID != commit.h.Txn.ID || begin.h.VChannel != commit.h.VChannel {
		return nil, wrapInvalid(ErrMalformed, "BeginTxn and CommitTxn belong to different transactions")
	}
	for _, m := range body {
		if m == nil || m.typ == nil || m.h.Txn == nil || m.h.Txn.ID != begin.h.Txn.ID || m.h.VChannel != begin.h.VChannel || !m.typ.Is(FlagTxnBody) {
			return nil, wrapInvalid(ErrMalformed, "a body message is not part of transaction %d", begin.h.Txn.ID)
		}
	}
	h := commit.h.clone()
	return &ImmutableMessage{
		typ: TypeTxn, id: commit.id, h: h,
		txn: &txnParts{begin: begin, body: append([]*ImmutableMessage(nil), body...), commit: commit},
	}, nil
}

// TxnBegin returns the BeginTxn of an assembled transaction, or nil.
func (m *ImmutableMessage) TxnBegin() *ImmutableMessage {
	if m.txn == nil {
		return nil
	}
	return m.txn.begin
}

// TxnBody returns the body messages of an assembled transaction, in order.
func (m *ImmutableMessage) TxnBody() []*ImmutableMessage {
	if m.txn == nil {
		return nil
	}
	return append([]*ImmutableMessage(nil), m.txn.body...)
}

// TxnCommit returns the CommitTxn of an assembled transaction, or nil.
func (m *ImmutableMessage) TxnCommit() *ImmutableMessage {
	if m.txn == nil {
		return nil
	}
	return m.txn.commit
}
