package runcuetype

// MaxFreeProbes is how many failed probes in a row a unit may run without
// spending its retry budget.
const MaxFreeProbes = 3

// CircuitState is a service's circuit breaker state. The strings are
// stable.
type CircuitState string

// Circuit breaker states.
const (
	CircuitClosed   CircuitState = "closed"
	CircuitOpen     CircuitState = "open"
	CircuitHalfOpen CircuitState = "half_open"
)
