// Package subscription implements the reserved Durable Streams subscription
// API (protocol §1.19) of the gateway: webhook and pull-wake subscriptions
// over family-1 streams, served below <StreamRoot>__ds/.
//
// # Routes
//
//	GET    __ds/jwks.json                          webhook signing keys (application/jwk-set+json)
//	PUT    __ds/subscriptions/{id}                 create (201), confirm identical (200), 409 if different
//	GET    __ds/subscriptions/{id}                 definition, links and acked offsets
//	DELETE __ds/subscriptions/{id}                 204, idempotent
//	POST   __ds/subscriptions/{id}/streams         add explicit links {"streams":[...]}, 204
//	DELETE __ds/subscriptions/{id}/streams/{path}  remove an explicit link (a glob link stays), 204
//	POST   __ds/subscriptions/{id}/callback        webhook worker: acks, heartbeat, done (Bearer token)
//	POST   __ds/subscriptions/{id}/claim           pull-wake: take the lease {"worker":...}
//	POST   __ds/subscriptions/{id}/ack             pull-wake: acks, heartbeat, done (Bearer token)
//	POST   __ds/subscriptions/{id}/release         pull-wake: give the lease back (Bearer token), 204
//
// Errors are {"error":{"code":...,"message":...}} with the status from the
// httpStatus table in http.go.
//
// # Model
//
// A subscription links streams either explicitly or through a glob pattern
// ("*" one segment, "**" any number). Each link has an acked offset. A link
// has pending work when the stream's tail (StreamService Head, next_offset)
// is greater than the acked offset; offsets compare as strings.
//
// When a linked stream has pending work and no wake is open, the manager
// opens a wake: the generation increases, a new wake id is drawn and the
// stream tails are snapshotted. A webhook wake is POSTed to the webhook URL
// with a Webhook-Signature header
//
//	t=<unix seconds>,kid=<kid>,ed25519=<base64url Ed25519 signature of "<t>.<raw body>">
//
// whose key is published at jwks.json (kid = "ds_" + base64url RFC 7638
// thumbprint). A 2xx answer {"done":true} acks the snapshot; any other 2xx
// starts a lease of lease_ttl_ms during which the worker calls back with the
// callback token; a failure is retried with exponential backoff (1 s doubling
// to 60 s, ±20 % jitter, MaxDeliveryAttempts in all). A pull-wake wake is
// announced by appending {"type":"wake","subscription_id",...} to the
// subscription's wake stream; a worker claims it and acks with the claim
// token. Tokens are HMAC-signed (per-process key) and carry the generation
// and wake id: a call for an older generation or wake gets 409 FENCED. An
// expired lease closes the wake and opens a new one if work is pending.
//
// Observer hooks (StreamCreated, StreamWritten, StreamDeleted) queue events
// that one goroutine applies in order: a new stream matching a pattern is
// linked at offset zero (all of it pending), a deleted stream's glob link is
// dropped and its explicit link rewound to zero. Only writes that reach the
// hooks, i.e. writes through this gateway, open wakes; claims look at the
// stream tails directly. Run also checks every subscription for pending
// work at start, since wakes are not persisted.
//
// # Webhook destinations
//
// A webhook is never delivered to loopback, unspecified, multicast,
// link-local (cloud metadata), private (RFC 1918, unique-local fc00::/7,
// carrier-grade NAT 100.64.0.0/10, site-local) or other special-purpose
// addresses (this-network, documentation, benchmarking, reserved,
// IPv4-compatible, Teredo), in any spelling: IPv4-mapped addresses count
// as their IPv4 address, NAT64 and 6to4 addresses as the IPv4 address
// they carry. The subscription is refused (400 WEBHOOK_URL_REJECTED) when
// its URL names such an address or this machine (localhost, *.localhost)
// or a cloud metadata name; a name is checked again at every delivery by
// the address the dialer actually connects to (net.Dialer's Control hook),
// so a name that resolves, or rebinds, to such an address is not dialled.
// Plain http is refused, proxies are not used and redirects not followed.
// Config.AllowWebhookHosts (allow_webhook_hosts, -subscriptions.allow-
// webhook-hosts) lists CIDR prefixes, addresses and host names admitted
// anyway, over http too, for development; allow_private_webhooks admits
// the private ranges and http.
//
// # Limits
//
// max_subscriptions (10000; all subscriptions live in the data bucket, so
// this is also the bound per bucket), max_subscriptions_per_stream (100,
// subscriptions linking one stream explicitly) and
// max_streams_per_subscription (1000, explicit links of one
// subscription): a create or an added link past one answers 429
// LIMIT_EXCEEDED and changes nothing. Request bodies (at most 1 MiB) are
// charged against the process's in-flight request-body budget (503
// OVERLOADED with Retry-After when it is full).
//
// # Durable state
//
// Definitions, links and acked offsets are persisted in the JSON stream
// Config.StateBucket/Config.StateStream (default __system/subscriptions),
// created on first use with content type application/json. Each change
// appends one record, a JSON object:
//
//	{"v":1,"op":"create","id":ID,"def":DEF,"links":[LINK...]}
//	{"v":1,"op":"links","id":ID,"links":[LINK...]}
//	{"v":1,"op":"delete","id":ID}
//
// DEF is {"id","type","pattern"?,"streams"?,"webhook_url"?,"wake_stream"?,
// "lease_ttl_ms","description"?,"created_at" (RFC 3339),"base_url"?,
// "config_hash"}; LINK is {"path","glob"?,"explicit"?,"acked"}. State is
// rebuilt by replaying records in stream order: "create" replaces the
// subscription ID with DEF and LINKs; "links" sets each LINK of an existing
// subscription to the given state, removing it when neither glob nor
// explicit is true; "delete" removes the subscription. Unknown ops are
// ignored. Wakes, generations, leases and delivery attempts live only in
// memory.
package subscription
