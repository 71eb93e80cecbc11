package fanout

import "errors"

// ErrMailboxFull: a mailbox over a bound, or closed, refused a delivery.
var ErrMailboxFull = errors.New("mailbox full")
