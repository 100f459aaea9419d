package app

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
)

// EnvPrefix starts the environment variable of every setting.
const EnvPrefix = "URSULA_"

// EnvName is the environment variable of the setting (or deprecated name)
// key: URSULA_ and the key in upper case, dots and dashes turned into
// underscores (raft.wal.fsync: URSULA_RAFT_WAL_FSYNC).
func EnvName(key string) string {
	return EnvPrefix + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(key))
}

// renamedKeys are the settings renamed to the seed's names. The old names
// stay accepted, with a warning, in the file, as flags and as environment
// variables, for one release.
var renamedKeys = []Deprecation{
	{Old: "raft.fsync", New: "raft.wal.fsync"},
	{Old: "raft.data_dir", New: "raft.wal.path"},
	{Old: "cold.dir", New: "storage.cold.root"},
	{Old: "cold.s3.prefix", New: "storage.cold.root"},
	{Old: "cold.external_min_bytes", New: "runtime.external_payload_min_size"},
}

// renamedSections are the tables renamed to the seed's names: every key of
// the old table is the key of the same name in the new one, except those
// renamedKeys moves elsewhere.
var renamedSections = []Deprecation{
	{Old: "cold", New: "storage.cold"},
}

// oldFlags are the flag names of earlier releases that differ from the
// settings' keys, kept as deprecated aliases because scripts and tests
// use them. Each maps to its setting by oldFlagKey.
var oldFlags = []string{
	"data-dir", "read-chunk-bytes", "expiry-sweep-interval",
	"raft.node-id", "raft.group-count", "raft.fsync", "raft.snapshot-entries", "raft.snapshot-bytes",
	"raft.sync-window", "raft.tick-interval", "raft.deleted-data-max-age", "raft.wal.segment-size",
	"storage.snapshot.drive-interval", "runtime.core-count", "runtime.gc-headroom",
	"node.listen", "node.max-message-bytes", "node.token-file", "node.allow-anonymous-clients",
	"node.tls.ca-file", "node.tls.cert-file", "node.tls.key-file",
	"admin.listen", "admin.allow-non-loopback", "admin.token-file", "admin.pprof",
	"admin.tls.ca-file", "admin.tls.cert-file", "admin.tls.key-file",
	"cluster.listen", "cluster.insecure-plaintext",
	"cluster.tls.ca-file", "cluster.tls.cert-file", "cluster.tls.key-file",
	"server.cluster-id", "server.http-inflight-body-size",
	"server.http.read-header-timeout", "server.http.body-read-timeout", "server.http.write-timeout",
	"server.http.idle-timeout", "server.http.max-header-bytes",
	"gateway.stream-root", "gateway.long-poll-timeout", "gateway.sse-reconnect-interval",
	"gateway.max-body-bytes", "gateway.read-chunk-bytes",
	"gateway.http.read-header-timeout", "gateway.http.body-read-timeout", "gateway.http.write-timeout",
	"gateway.http.idle-timeout", "gateway.http.max-header-bytes",
	"subscriptions.allow-webhook-hosts", "subscriptions.max-subscriptions",
	"subscriptions.max-per-stream", "subscriptions.max-streams",
	"upstream.refresh-interval", "upstream.dial-timeout", "upstream.max-message-bytes", "upstream.retry-after",
	"upstream.keepalive-time", "upstream.keepalive-timeout", "upstream.token-file", "upstream.in-process",
	"upstream.tls.ca-file", "upstream.tls.cert-file", "upstream.tls.key-file",
	"cold.backend", "cold.dir", "cold.s3.bucket", "cold.s3.prefix", "cold.s3.endpoint", "cold.s3.region",
	"cold.s3.path-style", "cold.flush-bytes", "cold.flush-age", "cold.group-flush-bytes", "cold.hot-cap-bytes",
	"cold.external-min-bytes", "cold.max-chunk-bytes", "cold.cache-bytes", "cold.block-bytes",
	"cold.flush-interval", "cold.flush-concurrency", "cold.gc-grace",
	"coldgc.compact-interval", "coldgc.small-chunk-bytes", "coldgc.max-chunk-bytes", "coldgc.sweep-interval",
	"coldgc.orphan-age",
	"backup.cold-store", "backup.keep-last", "backup.keep-within", "backup.hold-ttl",
	"telemetry.service-name",
}

// oldFlagPrefixes rename the old flags whose names were not their keys
// with dashes; the longest matching prefix applies.
var oldFlagPrefixes = []Deprecation{
	{Old: "data_dir", New: "raft.wal.path"},
	{Old: "read_chunk_bytes", New: "raft.read_chunk_bytes"},
	{Old: "expiry_sweep_interval", New: "raft.expiry_sweep_interval"},
	{Old: "node.listen", New: "server.listen"},
	{Old: "node.max_message_bytes", New: "server.max_message_bytes"},
	{Old: "node.token_file", New: "server.client_token_file"},
	{Old: "node.allow_anonymous_clients", New: "server.allow_anonymous_clients"},
	{Old: "node.tls.", New: "server.client_tls."},
	{Old: "admin.listen", New: "server.admin_listen"},
	{Old: "admin.allow_non_loopback", New: "server.allow_non_loopback_admin"},
	{Old: "admin.token_file", New: "server.admin_token_file"},
	{Old: "admin.pprof", New: "server.admin_pprof"},
	{Old: "admin.tls.", New: "server.admin_tls."},
	{Old: "cluster.listen", New: "server.cluster_listen"},
	{Old: "cluster.insecure_plaintext", New: "server.insecure_cluster_plaintext"},
	{Old: "cluster.tls.", New: "server.cluster_tls."},
	{Old: "subscriptions.max_per_stream", New: "subscriptions.max_subscriptions_per_stream"},
	{Old: "subscriptions.max_streams", New: "subscriptions.max_streams_per_subscription"},
}

// oldFlagKey is the setting an old flag name stands for.
func oldFlagKey(name string) string {
	k := strings.ReplaceAll(name, "-", "_")
	best := Deprecation{}
	for _, p := range oldFlagPrefixes {
		if strings.HasPrefix(k, p.Old) && len(p.Old) > len(best.Old) {
			best = p
		}
	}
	if best.Old != "" {
		k = best.New + strings.TrimPrefix(k, best.Old)
	}
	return renameKey(k)
}

// renameKey is the current name of a setting's key of an earlier release
// (the key itself when it was not renamed).
func renameKey(k string) string {
	for _, r := range renamedKeys {
		if k == r.Old {
			return r.New
		}
	}
	for _, r := range renamedSections {
		if strings.HasPrefix(k, r.Old+".") {
			return r.New + strings.TrimPrefix(k, r.Old)
		}
	}
	return k
}

// Deprecation is a deprecated name and the name that replaces it.
type Deprecation struct {
	Old, New string
}

// deprecations collects the deprecated names a configuration used, each
// once.
type deprecations struct {
	used []Deprecation
}

func (d *deprecations) note(old, new string) {
	if d == nil {
		return
	}
	dep := Deprecation{Old: old, New: new}
	if !slices.Contains(d.used, dep) {
		d.used = append(d.used, dep)
	}
}

// aliasValue is a deprecated flag: it sets its setting's flag and notes
// its use.
type aliasValue struct {
	flag.Value
	note func()
}

func (a aliasValue) Set(v string) error {
	a.note()
	return a.Value.Set(v)
}

// IsBoolFlag lets a boolean alias go without a value, as its setting.
func (a aliasValue) IsBoolFlag() bool {
	b, ok := a.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// aliasUsagePrefix starts the usage of every deprecated flag.
const aliasUsagePrefix = "deprecated: use -"

// flagAliases are the deprecated flag names and their settings: the old
// flags, and the old keys of renamed settings and sections.
func flagAliases(settings map[string]bool) map[string]string {
	aliases := map[string]string{}
	for _, old := range oldFlags {
		aliases[old] = oldFlagKey(old)
	}
	for _, r := range renamedKeys {
		aliases[r.Old] = r.New
	}
	for _, r := range renamedSections {
		for k := range settings {
			if rest, ok := strings.CutPrefix(k, r.New+"."); ok {
				if old := r.Old + "." + rest; renameKey(old) == k {
					aliases[old] = k
				}
			}
		}
	}
	for old, key := range aliases {
		if old == key {
			delete(aliases, old)
		}
	}
	return aliases
}

// settingNames are the names of the flags of fs that are settings.
func settingNames(fs *flag.FlagSet) map[string]bool {
	names := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		if !slices.Contains(metaFlags, f.Name) && !strings.HasPrefix(f.Usage, aliasUsagePrefix) {
			names[f.Name] = true
		}
	})
	return names
}

// registerAliases registers the deprecated flags on fs, where the settings
// are registered already; their use is noted in d (which may be nil).
func registerAliases(fs *flag.FlagSet, d *deprecations) {
	for old, key := range flagAliases(settingNames(fs)) {
		f := fs.Lookup(key)
		if f == nil {
			panic(fmt.Sprintf("app: deprecated flag -%s names no setting %s", old, key))
		}
		fs.Var(aliasValue{Value: f.Value, note: func() { d.note("-"+old, "-"+key) }}, old, aliasUsagePrefix+key)
	}
}

// decodeFile decodes the TOML file path into cfg, renaming deprecated keys
// (noted in d) and refusing unknown ones.
func decodeFile(path string, cfg *Config, d *deprecations) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	var tree map[string]any
	if _, err := toml.Decode(string(raw), &tree); err != nil {
		return fmt.Errorf("parse config %s: %w", path, err)
	}
	renamed, err := renameTree(tree, d)
	if err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	text := string(raw)
	if renamed {
		// The file is decoded in its current names; line numbers in
		// errors then refer to that form.
		var b bytes.Buffer
		if err := toml.NewEncoder(&b).Encode(tree); err != nil {
			return fmt.Errorf("config %s: %w", path, err)
		}
		text = b.String()
	}
	md, err := toml.Decode(text, cfg)
	if err != nil {
		return fmt.Errorf("parse config %s: %w", path, err)
	}
	if undec := md.Undecoded(); len(undec) > 0 {
		keys := make([]string, len(undec))
		for i, k := range undec {
			keys[i] = k.String()
		}
		note := ""
		if renamed {
			note = "; deprecated names are read as their current ones"
		}
		for _, k := range keys {
			if strings.HasPrefix(k, "storage.snapshot.") {
				note += "; S3 snapshots are not supported: snapshots are kept inline, in raft.wal.path"
				break
			}
		}
		return fmt.Errorf("config %s: unknown keys %s (every key is listed by -h%s)", path, strings.Join(keys, ", "), note)
	}
	return nil
}

// renameTree moves the deprecated keys and sections of a decoded TOML file
// to their current names; it reports whether it moved any. A setting given
// under both names is an error.
func renameTree(tree map[string]any, d *deprecations) (bool, error) {
	renamed := false
	for _, r := range renamedKeys {
		v, ok := lookupPath(tree, r.Old)
		if !ok {
			continue
		}
		if _, dup := lookupPath(tree, r.New); dup {
			return false, fmt.Errorf("%s is set twice: %s is a deprecated name of it", r.New, r.Old)
		}
		deletePath(tree, r.Old)
		if err := setPath(tree, r.New, v); err != nil {
			return false, err
		}
		d.note(r.Old, r.New)
		renamed = true
	}
	for _, r := range renamedSections {
		v, ok := lookupPath(tree, r.Old)
		if !ok {
			continue
		}
		old, ok := v.(map[string]any)
		if !ok {
			return false, fmt.Errorf("%s must be a table", r.Old)
		}
		deletePath(tree, r.Old)
		if err := mergeTable(tree, r.New, old, r.Old); err != nil {
			return false, err
		}
		d.note("["+r.Old+"]", "["+r.New+"]")
		renamed = true
	}
	return renamed, nil
}

// mergeTable moves every key of src into the table at path of tree; from
// names src's path in errors.
func mergeTable(tree map[string]any, path string, src map[string]any, from string) error {
	for k, v := range src {
		dst := path + "." + k
		if sub, ok := v.(map[string]any); ok {
			if err := mergeTable(tree, dst, sub, from+"."+k); err != nil {
				return err
			}
			continue
		}
		if _, dup := lookupPath(tree, dst); dup {
			return fmt.Errorf("%s is set twice: %s.%s is a deprecated name of it", dst, from, k)
		}
		if err := setPath(tree, dst, v); err != nil {
			return err
		}
	}
	return nil
}

func lookupPath(tree map[string]any, path string) (any, bool) {
	parts := strings.Split(path, ".")
	var cur any = tree
	for _, p := range parts {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[p]; !ok {
			return nil, false
		}
	}
	return cur, true
}

func deletePath(tree map[string]any, path string) {
	parent, last := path, path
	if i := strings.LastIndex(path, "."); i >= 0 {
		parent, last = path[:i], path[i+1:]
		v, ok := lookupPath(tree, parent)
		if !ok {
			return
		}
		if m, ok := v.(map[string]any); ok {
			delete(m, last)
		}
		return
	}
	delete(tree, parent)
}

func setPath(tree map[string]any, path string, v any) error {
	parts := strings.Split(path, ".")
	m := tree
	for i, p := range parts[:len(parts)-1] {
		next, ok := m[p]
		if !ok {
			n := map[string]any{}
			m[p] = n
			m = n
			continue
		}
		if m, ok = next.(map[string]any); !ok {
			return fmt.Errorf("%s must be a table", strings.Join(parts[:i+1], "."))
		}
	}
	m[parts[len(parts)-1]] = v
	return nil
}

// applyEnv sets the settings given by URSULA_* variables of environ, and
// refuses variables that look like settings but name none (their first
// word is a section, as in URSULA_RAFT_...).
func applyEnv(fs *flag.FlagSet, environ []string, d *deprecations) error {
	settings := settingNames(fs)
	type target struct{ key, deprecated string }
	byEnv := map[string]target{}
	sections := map[string]bool{}
	for k := range settings {
		byEnv[EnvName(k)] = target{key: k}
		sections[strings.SplitN(k, ".", 2)[0]] = true
	}
	for old, key := range flagAliases(settings) {
		if renameKey(old) == key && !strings.Contains(old, "-") {
			byEnv[EnvName(old)] = target{key: key, deprecated: old}
			sections[strings.SplitN(old, ".", 2)[0]] = true
		}
	}
	var errs []error
	given := map[string]string{} // setting -> variable
	for _, kv := range environ {
		name, val, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, EnvPrefix) {
			continue
		}
		t, ok := byEnv[name]
		if !ok {
			if looksLikeSetting(name, sections) {
				errs = append(errs, fmt.Errorf("environment variable %s names no setting (every setting and its variable is listed by -h)", name))
			}
			continue
		}
		if other, dup := given[t.key]; dup {
			errs = append(errs, fmt.Errorf("environment variables %s and %s both set %s", other, name, t.key))
			continue
		}
		given[t.key] = name
		if t.deprecated != "" {
			d.note(name, EnvName(t.key))
		}
		if err := fs.Set(t.key, val); err != nil {
			errs = append(errs, fmt.Errorf("environment variable %s (%s): invalid value %q: %w", name, t.key, val, err))
		}
	}
	return errors.Join(errs...)
}

// looksLikeSetting reports whether an URSULA_* variable starts with the
// name of a section or top-level setting.
func looksLikeSetting(name string, sections map[string]bool) bool {
	rest := strings.ToLower(strings.TrimPrefix(name, EnvPrefix))
	for s := range sections {
		if rest == s || strings.HasPrefix(rest, s+"_") {
			return true
		}
	}
	return false
}

// setting is one setting as -h and docs/configuration.md show it.
type setting struct {
	Key, Table, Type, Default, Usage string
}

// listSettings lists the settings of target, sorted by table and key.
func listSettings(target string) []setting {
	fs := flag.NewFlagSet("ursula", flag.ContinueOnError)
	var c Config
	c.registerFlags(fs, target)
	var out []setting
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		if typ == "value" {
			typ = "list"
		}
		if typ == "" {
			typ = "bool"
		}
		table := ""
		if i := strings.LastIndex(f.Name, "."); i >= 0 {
			table = f.Name[:i]
		}
		out = append(out, setting{Key: f.Name, Table: table, Type: typ, Default: f.DefValue, Usage: usage})
	})
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Table != out[j].Table {
			return out[i].Table < out[j].Table
		}
		return out[i].Key < out[j].Key
	})
	return out
}
