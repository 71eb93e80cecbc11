package fanout

import "errors"

// ErrMailboxFull: a mailbox over a bound, or closed, refused a delivery.
var ErrMailboxFull = errors.New("mailbox full")

// The codes a view ends with (View.OnEnd); the gateway's public error
// codes of the same names.
const (
	CodeViewTooLarge    = "view_too_large"
	CodeFilterTooCostly = "filter_too_costly"
)
