// Package runcuetype holds the vocabulary runcue and its engine share: a
// service's limits (Service, Meter, Budget, Adaptive), retry policies, and
// what runcue reports (ServiceStatus, Explanation, Stats, QueueStatus).
//
// Package runcue names every type of it (runcue.Service is
// runcuetype.Service), so a program that uses runcue need not import this
// package. It exists so that runcue's internal packages use the same types
// as its users, with nothing copied between them. It depends only on the
// standard library and package store.
package runcuetype
