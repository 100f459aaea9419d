// Package lifecycle runs the roles of one process (storage, node, gateway,
// cold-GC worker) under one supervisor: they start in order, stop in
// reverse order, and the first role that fails stops the whole process
// with an error that names it. A role that returns before it was asked to
// stop has failed, even without an error: a process that keeps running
// without one of its roles would answer 503s forever while its readiness
// said otherwise.
package lifecycle
