// Package memlimit bounds how far the Go heap grows past its live part
// between collections, and stops the process past an emergency cap.
//
// With the default GOGC=100 the heap grows to twice the live heap before a
// collection. A node's live heap is mostly stream bytes held in memory:
// large, pointer-free buffers the collector marks at almost no cost, so
// doubling them buys nothing but memory. Once the live heap passes the
// headroom, Run keeps a soft memory limit (runtime/debug.SetMemoryLimit) of
// the runtime's other memory plus the live heap plus the headroom,
// recomputed after every collection, so the heap's growth between
// collections stays within the headroom. Below it, GOGC paces the collector
// as usual.
//
// The headroom is never less than the scannable heap up to 256 MiB, nor
// less than a quarter of it past that: a node with many idle streams holds
// its live heap in small pointerful objects the collector must scan, and a
// growth fixed in bytes would make it collect (and scan them all) ever more
// often as the stream count grows. An explicit GOMEMLIMIT in the
// environment turns this off.
//
// The same loop enforces runtime.node_memory_abort_cap_size, the emergency
// stop of the operations contract: past it the process logs why and exits
// at once with abort()'s status, without handing off leadership or
// recording a clean shutdown, as an OOM kill would, so that a supervisor
// restarts it before the kernel's killer picks a victim.
package memlimit
