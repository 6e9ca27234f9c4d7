package runcuetype

import "errors"

// ErrInvalid reports an invalid argument: a limit, a name, a policy.
// runcue.ErrInvalid is the same error.
var ErrInvalid = errors.New("runcue: invalid argument")
