package postgres

import "github.com/jackc/pgx/v5"

// WithTracer returns o with the connections' statements traced by tr.
func WithTracer(o Options, tr pgx.QueryTracer) Options {
	o.tracer = tr
	return o
}
