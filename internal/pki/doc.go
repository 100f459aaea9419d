// Package pki holds who Ursula's processes are on the wire: the identity a
// certificate proves, TLS material that reloads from disk without a
// restart, gRPC transport credentials over it, and a small issuer for
// development clusters and tests.
//
// # Identities
//
// A certificate proves exactly one identity, carried as one URI subject
// alternative name:
//
//	urn:ursula:node:<id>     a storage node; <id> is its raft.node_id (decimal, non-zero)
//	urn:ursula:role:<role>   another process: gateway, coldgc or backup
//
// Names and addresses in the certificate are not checked: a peer is who its
// URI says, provided the certificate chains to the configured CA. So one
// cluster CA per deployment: every certificate it signs is trusted by every
// plane that uses it, within the rights of the identity it names.
//
// # Reloading
//
// A Source re-reads its three files (CA bundle, certificate chain, key)
// when any of them changed (size, modification time or inode), checked at
// most once per CheckInterval on the next handshake. A new set that does not
// load (a key that does not match, a half-written file) is logged and the
// previous material stays in use, so rotating is: write the new files (the
// CA bundle may hold the old and the new CA during a rotation), and the next
// connections use them; existing connections keep theirs.
package pki
