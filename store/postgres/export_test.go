package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// WithTracer returns o with the connections' statements traced by tr.
func WithTracer(o Options, tr pgx.QueryTracer) Options {
	o.tracer = tr
	return o
}

// WithoutCopy returns o with units written by INSERT only, never COPY.
func WithoutCopy(o Options) Options {
	o.noCopy = true
	return o
}

// XactCommitted is xactCommitted: whether transaction id, begun on the
// server started at server, committed; last is the last event it appended
// (0 for none).
func XactCommitted(ctx context.Context, s *Store, id int64, server time.Time, last int64) (bool, error) {
	return s.xactCommitted(ctx, xact{id: id, server: server, last: last})
}
