package cdc

import (
	"github.com/fanwire/fanwire/broker"
)

// projection is the stage between decoding and publishing: it turns one
// committed change of a table into the events of the documents the change
// affects. A projection that embeds child rows in parent documents maps a
// child's change to its parents' documents; a table is the trivial
// projection (tableProjection), whose document is the row.
type projection interface {
	// project appends to evs the events of change c of table t, committed
	// in tx, with idempotency id id (eventid.go). A row that cannot be
	// published is appended as its error event, and reported with a
	// *badRowError.
	project(evs []broker.Outgoing, tx *txn, t *table, c *change, id string) ([]broker.Outgoing, error)
}

// tableProjection publishes a table's rows as they are.
type tableProjection struct{}

func (tableProjection) project(evs []broker.Outgoing, tx *txn, t *table, c *change, i string) ([]broker.Outgoing, error) {
	op := opNames[c.kind]
	if tx.enc != nil {
		if ev, ok := tx.enc.rowEvent(t, c, i, op); ok {
			return append(evs, ev), nil
		}
	}
	ev, err := rowEvent(t, c, i, tx.commitLSN, tx.commitTime, op)
	if err != nil {
		if _, bad := asBadRow(err); !bad {
			return evs, err
		}
	}
	return append(evs, ev), err
}
