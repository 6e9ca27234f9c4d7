package runcue

// Circuit breakers.
//
// A service with CircuitThreshold and CircuitTimeout has a circuit. It is
// closed while runs succeed. CircuitThreshold consecutive failed runs open
// it: nothing of the service is dispatched for CircuitTimeout. Then it is
// half-open: exactly one run (the probe) is dispatched; its success closes
// the circuit, its failure opens it again for another CircuitTimeout, and a
// probe that ends without a verdict (cancelled, interrupted) lets another
// probe go.
//
// What counts: a run that fails or times out counts as a failure; a
// success resets the count; a run cancelled, interrupted by shutdown,
// failed with Permanent (bad input, not a sick service) or deferred by a
// Retry-After says nothing about the service's health. Each keyed instance
// ("host:example.org") has a circuit of its own.
//
// The state (and any Retry-After hold) is persisted on every change, so
// an open circuit stays open across a restart; a half-open circuit whose
// probe died with its owner is restored open, to probe again. A closed
// circuit's count of consecutive failures is persisted too.
//
// A failed probe is the service's failure, not its unit's: the unit comes
// back to the queue, behind the units queued with it, without spending its
// retry budget, so that another queued unit is the next probe. A unit whose probes failed MaxFreeProbes times
// in a row (counted by the owner) spends a run on its next failed probe,
// as on any failure: a unit that fails for its own reasons cannot hold a
// circuit open.
