package subscription

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
)

// errAddressBlocked is returned by the webhook dialer for a forbidden address.
var errAddressBlocked = errors.New("subscription: webhook address blocked")

// specialRange is a special-purpose address range a webhook is never
// delivered to (unless allowed); private ranges are allowed by
// AllowPrivateWebhooks.
type specialRange struct {
	prefix  netip.Prefix
	reason  string
	private bool
}

// specialRanges are the special-purpose ranges netip.Addr's predicates do
// not name (loopback, unspecified, multicast, link-local and RFC 1918 /
// unique-local private are checked by predicate).
var specialRanges = []specialRange{
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network", false},
	{netip.MustParsePrefix("100.64.0.0/10"), "carrier-grade NAT", true},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignment", false},
	{netip.MustParsePrefix("192.0.2.0/24"), "documentation", false},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking", false},
	{netip.MustParsePrefix("198.51.100.0/24"), "documentation", false},
	{netip.MustParsePrefix("203.0.113.0/24"), "documentation", false},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved or broadcast", false},
	{netip.MustParsePrefix("::/96"), "IPv4-compatible", false},
	{netip.MustParsePrefix("100::/64"), "discard-only", false},
	{netip.MustParsePrefix("2001::/32"), "Teredo", false},
	{netip.MustParsePrefix("2001:db8::/32"), "documentation", false},
	{netip.MustParsePrefix("fec0::/10"), "site-local", true},
}

// Ranges of IPv6 addresses that carry an IPv4 address, which is checked
// in their place: NAT64 (the last 32 bits) and 6to4 (bits 16 to 48).
var (
	nat64Prefixes = []netip.Prefix{netip.MustParsePrefix("64:ff9b::/96"), netip.MustParsePrefix("64:ff9b:1::/48")}
	sixToFour     = netip.MustParsePrefix("2002::/16")
)

// metadataHosts are cloud metadata host names refused regardless of what
// they resolve to (unless listed in AllowWebhookHosts).
var metadataHosts = map[string]bool{
	"metadata":                 true,
	"metadata.google.internal": true,
	"metadata.goog":            true,
	"instance-data":            true,
}

// classify names the special-purpose range holding a ("" for an ordinary
// public unicast address) and whether it is a private one.
func classify(a netip.Addr) (reason string, private bool) {
	a = a.Unmap() // IPv4-mapped IPv6 (::ffff:a.b.c.d) is its IPv4 address
	switch {
	case !a.IsValid():
		return "invalid", false
	case a.IsLoopback():
		return "loopback", false
	case a.IsUnspecified():
		return "unspecified", false
	case a.IsMulticast():
		return "multicast", false
	case a.IsLinkLocalUnicast():
		return "link-local", false
	case a.IsPrivate():
		return "private", true
	}
	if a.Is6() {
		b := a.As16()
		for _, p := range nat64Prefixes {
			if p.Contains(a) {
				return classifyEmbedded(netip.AddrFrom4([4]byte(b[12:16])), "NAT64")
			}
		}
		if sixToFour.Contains(a) {
			return classifyEmbedded(netip.AddrFrom4([4]byte(b[2:6])), "6to4")
		}
	}
	for _, r := range specialRanges {
		if r.prefix.Contains(a) {
			return r.reason, r.private
		}
	}
	return "", false
}

func classifyEmbedded(v4 netip.Addr, via string) (string, bool) {
	reason, private := classify(v4)
	if reason == "" {
		return "", false
	}
	return reason + " (" + via + " of " + v4.String() + ")", private
}

// addressPolicy decides which webhook destinations may be dialled.
type addressPolicy struct {
	// allowPrivate admits private ranges (RFC 1918, unique-local,
	// carrier-grade NAT, site-local) and plain http to any host.
	allowPrivate bool
	// nets and names are AllowWebhookHosts: addresses in nets, and every
	// address of a host named in names, are always admitted.
	nets  []netip.Prefix
	names map[string]bool
}

// newAddressPolicy parses AllowWebhookHosts: CIDR prefixes, single
// addresses, or host names.
func newAddressPolicy(allowPrivate bool, allow []string) (*addressPolicy, error) {
	p := &addressPolicy{allowPrivate: allowPrivate, names: map[string]bool{}}
	for _, e := range allow {
		e = strings.TrimSpace(e)
		switch {
		case e == "":
			return nil, errors.New("allow_webhook_hosts: empty entry")
		case strings.Contains(e, "/"):
			pfx, err := netip.ParsePrefix(e)
			if err != nil {
				return nil, fmt.Errorf("allow_webhook_hosts: %q: %w", e, err)
			}
			p.nets = append(p.nets, pfx.Masked())
		default:
			if a, err := netip.ParseAddr(strings.Trim(e, "[]")); err == nil {
				p.nets = append(p.nets, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
				continue
			}
			name := normalizeHost(e)
			if name == "" || strings.ContainsAny(name, " :@") {
				return nil, fmt.Errorf("allow_webhook_hosts: %q is neither a CIDR prefix, an address nor a host name", e)
			}
			p.names[name] = true
		}
	}
	return p, nil
}

// normalizeHost lower-cases a host name and drops a trailing dot.
func normalizeHost(h string) string { return strings.TrimSuffix(strings.ToLower(h), ".") }

// nameListed reports whether the host name is listed.
func (p *addressPolicy) nameListed(host string) bool { return p.names[normalizeHost(host)] }

// netListed reports whether a lies in a listed prefix.
func (p *addressPolicy) netListed(a netip.Addr) bool {
	for _, n := range p.nets {
		if n.Contains(a) || n.Contains(a.Unmap()) {
			return true
		}
	}
	return false
}

// check reports why a must not be dialled, or nil; nameListed says whether
// the URL's host name is listed (then any address of it may be dialled).
func (p *addressPolicy) check(a netip.Addr, nameListed bool) error {
	if nameListed || p.netListed(a) {
		return nil
	}
	reason, private := classify(a)
	if reason == "" || private && p.allowPrivate {
		return nil
	}
	return fmt.Errorf("%w: %s address %s", errAddressBlocked, reason, a)
}

// isLocalName reports host names that always mean this machine.
func isLocalName(host string) bool {
	h := normalizeHost(host)
	return h == "localhost" || strings.HasSuffix(h, ".localhost")
}

// validateWebhookURL checks a webhook URL at subscription time: its form,
// its scheme, and its host when that is an address or a name of this
// machine. Names are checked again, by the addresses they resolve to, when
// a delivery dials them (webhookDialer).
func (p *addressPolicy) validateWebhookURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() || u.Host == "" || u.Opaque != "" {
		return errors.New("webhook.url must be an absolute http(s) URL")
	}
	if u.User != nil {
		return errors.New("webhook.url must not carry credentials")
	}
	host := u.Hostname()
	if host == "" {
		return errors.New("webhook.url must name a host")
	}
	addr, literal := netip.Addr{}, false
	if a, err := netip.ParseAddr(host); err == nil {
		addr, literal = a, true
	}
	listed := p.nameListed(host) || literal && p.netListed(addr) ||
		isLocalName(host) && (p.netListed(netip.IPv6Loopback()) || p.netListed(netip.AddrFrom4([4]byte{127, 0, 0, 1})))
	switch u.Scheme {
	case "https":
	case "http":
		if !listed && !p.allowPrivate {
			return errors.New("webhook.url must use https (plain http only to hosts listed in allow_webhook_hosts)")
		}
	default:
		return errors.New("webhook.url must use https")
	}
	if listed {
		return nil
	}
	if metadataHosts[normalizeHost(host)] {
		return errors.New("webhook.url must not target a metadata service")
	}
	if isLocalName(host) {
		return errors.New("webhook.url must not target this machine (list it in allow_webhook_hosts for development)")
	}
	if literal {
		if err := p.check(addr, false); err != nil {
			return fmt.Errorf("webhook.url must not target loopback, private, link-local or other special-purpose addresses (%s)", addr)
		}
	}
	return nil
}

// webhookDialer dials webhook hosts, checking every address it actually
// connects to (after resolution, in the dialer's Control hook, so a name
// that resolves, or rebinds, to an internal address is refused however it
// resolved earlier).
type webhookDialer struct {
	dialer net.Dialer // a template; Control is set per dial
	policy *addressPolicy
}

func (d *webhookDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("dial webhook %s: %w", addr, err)
	}
	listed := d.policy.nameListed(host)
	if metadataHosts[normalizeHost(host)] && !listed {
		return nil, fmt.Errorf("dial webhook %s: %w: metadata host", addr, errAddressBlocked)
	}
	dl := d.dialer
	dl.Control = func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("%w: unexpected address %q", errAddressBlocked, address)
		}
		return d.policy.check(ap.Addr(), listed)
	}
	conn, err := dl.DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("dial webhook %s: %w", addr, err)
	}
	return conn, nil
}
