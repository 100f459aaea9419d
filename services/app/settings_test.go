package app

import (
	"bytes"
	"encoding"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/ursula/ursula/internal/buildinfo"
	"github.com/ursula/ursula/storage/cluster"
)

var update = flag.Bool("update", false, "rewrite docs/configuration.md")

var targets = []string{TargetAll, TargetNode, TargetGateway, TargetColdGC, TargetBackup}

// tomlKeys walks a configuration type by its toml tags and returns the
// dotted key of every leaf: a value that is not a table (an array of
// tables and a map are one leaf each).
func tomlKeys(t reflect.Type, prefix string) []string {
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		tag := strings.Split(f.Tag.Get("toml"), ",")[0]
		if tag == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		ft := f.Type
		isTable := ft.Kind() == reflect.Struct && !reflect.PointerTo(ft).Implements(reflect.TypeFor[encoding.TextUnmarshaler]())
		if f.Anonymous && tag == "" && isTable {
			keys = append(keys, tomlKeys(ft, prefix)...)
			continue
		}
		name := tag
		if name == "" {
			name = f.Name
		}
		if isTable {
			keys = append(keys, tomlKeys(ft, prefix+name+".")...)
			continue
		}
		keys = append(keys, prefix+name)
	}
	return keys
}

func registered(t testing.TB, target string) *flag.FlagSet {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	var c Config
	c.registerFlags(fs, target)
	registerAliases(fs, nil)
	registerMeta(fs)
	return fs
}

// TestSettingsAreTOMLKeys is the cross-check of the vocabulary: every leaf
// of the TOML tree has exactly one flag of its name, every flag is a TOML
// key, a meta flag or a deprecated alias of a setting, and every setting
// has its own environment variable.
func TestSettingsAreTOMLKeys(t *testing.T) {
	keys := tomlKeys(reflect.TypeFor[Config](), "")
	if len(keys) < 100 {
		t.Fatalf("only %d TOML keys found: the walk is broken", len(keys))
	}
	for _, target := range targets {
		t.Run(target, func(t *testing.T) {
			fs := registered(t, target)
			settings := settingNames(fs)
			for _, k := range keys {
				if !settings[k] {
					t.Errorf("TOML key %s has no flag -%s", k, k)
				}
			}
			for s := range settings {
				if !slices.Contains(keys, s) {
					t.Errorf("flag -%s is not a TOML key", s)
				}
			}
			fs.VisitAll(func(f *flag.Flag) {
				if settings[f.Name] || slices.Contains(metaFlags, f.Name) {
					return
				}
				key, ok := strings.CutPrefix(f.Usage, aliasUsagePrefix)
				if !ok || !settings[key] {
					t.Errorf("flag -%s is neither a setting, a meta flag nor an alias of one (usage %q)", f.Name, f.Usage)
				}
			})
			envs := map[string]string{}
			for s := range settings {
				e := EnvName(s)
				if other, dup := envs[e]; dup {
					t.Errorf("%s and %s share the environment variable %s", s, other, e)
				}
				envs[e] = s
			}
			for old, key := range flagAliases(settings) {
				if s, taken := envs[EnvName(old)]; taken && s != key {
					t.Errorf("deprecated %s has the variable %s of the setting %s", old, EnvName(old), s)
				}
			}
		})
	}
}

// TestPrintConfigIsCanonical: -print-config prints every setting -h
// lists, by its current key, and nothing else; what it prints loads back to
// the same configuration without a warning.
func TestPrintConfigIsCanonical(t *testing.T) {
	keys := tomlKeys(reflect.TypeFor[Config](), "")
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"defaults", nil},
		{"lists set", []string{"-raft.peers=1/127.0.0.1:4439/127.0.0.1:4447", "-log.levels=engine=debug", "-upstream.nodes=a:1,b:2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := load(tc.args, nil, TargetAll)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := writeConfig(&buf, cfg); err != nil {
				t.Fatal(err)
			}
			printed := printedKeys(t, buf.String())
			for _, k := range keys {
				if !printed[k] {
					t.Errorf("-print-config does not print %s", k)
				}
			}
			for k := range printed {
				if !slices.Contains(keys, k) {
					t.Errorf("-print-config prints %s, which is not a setting", k)
				}
			}
			file := filepath.Join(t.TempDir(), "printed.toml")
			if err := os.WriteFile(file, buf.Bytes(), 0o600); err != nil {
				t.Fatal(err)
			}
			again, flags, err := load([]string{"-config", file}, nil, TargetAll)
			if err != nil {
				t.Fatalf("loading -print-config's output: %v", err)
			}
			if len(flags.Deprecated) != 0 {
				t.Errorf("-print-config's output uses deprecated names: %v", flags.Deprecated)
			}
			var buf2 bytes.Buffer
			if err := writeConfig(&buf2, again); err != nil {
				t.Fatal(err)
			}
			if buf2.String() != buf.String() {
				t.Errorf("-print-config's output loads to\n%s\nwant\n%s", buf2.String(), buf.String())
			}
		})
	}
}

// printedKeys are the settings a TOML text sets: its keys whose values are
// not tables, and the map setting log.levels (a table of free keys).
func printedKeys(t *testing.T, text string) map[string]bool {
	t.Helper()
	var tree map[string]any
	md, err := toml.Decode(text, &tree)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for _, k := range md.Keys() {
		s := k.String()
		if strings.HasPrefix(s, "raft.peers.") || strings.HasPrefix(s, "log.levels.") {
			continue
		}
		if v, ok := lookupPath(tree, s); ok {
			if _, isTable := v.(map[string]any); isTable && s != "log.levels" {
				continue
			}
		}
		keys[s] = true
	}
	return keys
}

func writeFile(t *testing.T, text string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "ursula.toml")
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// TestPrecedence: defaults < file < environment < flags, for each kind of
// value.
func TestPrecedence(t *testing.T) {
	file := writeFile(t, `
[raft.wal]
fsync = "always"
[server]
cluster_id = "from-file"
[upstream]
nodes = ["file:1"]
[gateway]
long_poll_timeout = "7s"
`)
	type want struct {
		fsync, clusterID, nodes string
		longPoll                time.Duration
	}
	tests := []struct {
		name string
		args []string
		env  []string
		want want
	}{
		{"defaults", nil, nil, want{"never", "local", "", 3 * time.Second}},
		{"file", []string{"-config", file}, nil, want{"always", "from-file", "file:1", 7 * time.Second}},
		{"env over defaults", nil, []string{"URSULA_SERVER_CLUSTER_ID=from-env"}, want{"never", "from-env", "", 3 * time.Second}},
		{"env over file", []string{"-config", file}, []string{
			"URSULA_RAFT_WAL_FSYNC=never", "URSULA_SERVER_CLUSTER_ID=from-env", "URSULA_UPSTREAM_NODES=env:1, env:2", "URSULA_GATEWAY_LONG_POLL_TIMEOUT=9s",
		}, want{"never", "from-env", "env:1,env:2", 9 * time.Second}},
		{"flag over env over file", []string{"-config", file, "-server.cluster_id=from-flag", "-upstream.nodes=flag:1"},
			[]string{"URSULA_SERVER_CLUSTER_ID=from-env", "URSULA_UPSTREAM_NODES=env:1"}, want{"always", "from-flag", "flag:1", 7 * time.Second}},
		{"unrelated variables", nil, []string{"URSULA_BIN=/x", "URSULA_FORMAT_EPOCH=1", "PATH=/bin", "URSULA_TEST_ARTIFACTS=/tmp"}, want{"never", "local", "", 3 * time.Second}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := load(tc.args, tc.env, TargetAll)
			if err != nil {
				t.Fatalf("load: %v", err)
			}
			got := want{cfg.Engine.WAL.Fsync, cfg.Node.ClusterID, strings.Join(cfg.Upstream.Nodes, ","), cfg.Gateway.LongPollTimeout}
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			if cfg.Engine.Fsync != got.fsync {
				t.Errorf("engine fsync %q, want raft.wal.fsync %q", cfg.Engine.Fsync, got.fsync)
			}
		})
	}
}

// TestDeprecatedNames: the names of earlier releases still work, in the
// file, as flags and in the environment, and each is reported once.
func TestDeprecatedNames(t *testing.T) {
	oldFile := writeFile(t, `
[raft]
fsync = "always"
data_dir = "/var/old"
[cold]
backend = "fs"
dir = "/var/old-cold"
external_min_bytes = 4096
flush_bytes = 2048
`)
	s3File := writeFile(t, `
[cold]
backend = "s3"
[cold.s3]
bucket = "b"
prefix = "ursula/dev"
region = "eu-west-1"
`)
	tests := []struct {
		name     string
		args     []string
		env      []string
		check    func(*testing.T, *Config)
		wantDeps []Deprecation
	}{
		{"file", []string{"-config", oldFile}, nil, func(t *testing.T, c *Config) {
			sc := c.Storage.Cold
			if c.Engine.WAL.Fsync != "always" || c.Engine.DataDir != "/var/old" || sc.Root != "/var/old-cold" || sc.Dir != "/var/old-cold" ||
				c.Runtime.ExternalPayloadMinSize != 4096 || c.Engine.Cold.ExternalMinBytes != 4096 || sc.FlushBytes != 2048 {
				t.Fatalf("wal %+v data dir %q cold %+v runtime %+v", c.Engine.WAL, c.Engine.DataDir, sc, c.Runtime)
			}
		}, []Deprecation{{"raft.fsync", "raft.wal.fsync"}, {"raft.data_dir", "raft.wal.path"}, {"cold.dir", "storage.cold.root"},
			{"cold.external_min_bytes", "runtime.external_payload_min_size"}, {"[cold]", "[storage.cold]"}}},
		{"s3 prefix", []string{"-config", s3File}, nil, func(t *testing.T, c *Config) {
			sc := c.Storage.Cold
			if sc.Backend != "s3" || sc.Root != "ursula/dev" || sc.S3.Prefix != "ursula/dev" || sc.Dir != "" || sc.S3.Bucket != "b" || sc.S3.Region != "eu-west-1" {
				t.Fatalf("cold %+v", sc)
			}
		}, []Deprecation{{"cold.s3.prefix", "storage.cold.root"}, {"[cold]", "[storage.cold]"}}},
		{"old flags", []string{"-data-dir=/d", "-node.listen=127.0.0.1:1", "-admin.listen=127.0.0.1:2", "-cluster.listen=127.0.0.1:3",
			"-raft.fsync=always", "-cold.dir=/c", "-cold.s3.path-style", "-subscriptions.max-per-stream=7", "-gateway.http.write-timeout=5s"}, nil,
			func(t *testing.T, c *Config) {
				if c.Engine.DataDir != "/d" || c.Node.Listen != "127.0.0.1:1" || c.Node.AdminListen != "127.0.0.1:2" || c.Node.ClusterListen != "127.0.0.1:3" ||
					c.Engine.Fsync != "always" || c.Storage.Cold.Dir != "/c" || !c.Storage.Cold.S3.PathStyle ||
					c.Subscriptions.MaxSubscriptionsPerStream != 7 || c.Gateway.HTTP.WriteTimeout != 5*time.Second {
					t.Fatalf("%+v", c)
				}
			}, []Deprecation{{"-data-dir", "-raft.wal.path"}, {"-node.listen", "-server.listen"}, {"-admin.listen", "-server.admin_listen"},
				{"-cluster.listen", "-server.cluster_listen"}, {"-raft.fsync", "-raft.wal.fsync"}, {"-cold.dir", "-storage.cold.root"},
				{"-cold.s3.path-style", "-storage.cold.s3.path_style"}, {"-subscriptions.max-per-stream", "-subscriptions.max_subscriptions_per_stream"},
				{"-gateway.http.write-timeout", "-gateway.http.write_timeout"}}},
		{"old environment", nil, []string{"URSULA_RAFT_FSYNC=always", "URSULA_COLD_DIR=/e", "URSULA_COLD_FLUSH_BYTES=4096"}, func(t *testing.T, c *Config) {
			if c.Engine.Fsync != "always" || c.Storage.Cold.Dir != "/e" || c.Storage.Cold.FlushBytes != 4096 {
				t.Fatalf("%+v", c)
			}
		}, []Deprecation{{"URSULA_RAFT_FSYNC", "URSULA_RAFT_WAL_FSYNC"}, {"URSULA_COLD_DIR", "URSULA_STORAGE_COLD_ROOT"},
			{"URSULA_COLD_FLUSH_BYTES", "URSULA_STORAGE_COLD_FLUSH_BYTES"}}},
		{"a flag used twice is reported once", []string{"-data-dir=/a", "-data-dir=/b"}, nil, func(t *testing.T, c *Config) {
			if c.Engine.DataDir != "/b" {
				t.Fatalf("data dir %q", c.Engine.DataDir)
			}
		}, []Deprecation{{"-data-dir", "-raft.wal.path"}}},
		{"canonical names warn nothing", []string{"-raft.wal.path=/x", "-storage.cold.root=/y"}, []string{"URSULA_RAFT_WAL_FSYNC=always"}, func(t *testing.T, c *Config) {
			if c.Engine.DataDir != "/x" || c.Storage.Cold.Dir != "/y" || c.Engine.Fsync != "always" {
				t.Fatalf("%+v", c)
			}
		}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, flags, err := load(tc.args, tc.env, TargetAll)
			if err != nil {
				t.Fatalf("load: %v", err)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			tc.check(t, cfg)
			got, want := slices.Clone(flags.Deprecated), slices.Clone(tc.wantDeps)
			less := func(a, b Deprecation) int { return strings.Compare(a.Old, b.Old) }
			slices.SortFunc(got, less)
			slices.SortFunc(want, less)
			if !slices.Equal(got, want) {
				t.Errorf("deprecations %v, want %v", got, want)
			}
		})
	}
}

// TestBadConfigRefused: unknown keys and variables, bad values and names
// given twice are refused with an error naming them.
func TestBadConfigRefused(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		args    []string
		env     []string
		wantErr []string
	}{
		{"unknown key", "[raft.wal]\nbackend = \"memory\"\n", nil, nil, []string{"unknown keys", "raft.wal.backend"}},
		{"S3 snapshot keys", "[storage.snapshot]\nbackend = \"s3\"\ns3_prefix = \"snaps\"\n", nil, nil, []string{"storage.snapshot.s3_prefix", "S3 snapshots are not supported"}},
		{"removed WAL keys", "[raft.wal]\nallow_volatile_multi_peer = true\n", nil, nil, []string{"unknown keys", "raft.wal.allow_volatile_multi_peer"}},
		{"unknown key in the old section", "[cold]\nbogus = 1\n", nil, nil, []string{"unknown keys", "storage.cold.bogus"}},
		{"old and new name", "[raft]\nfsync = \"always\"\n[raft.wal]\nfsync = \"never\"\n", nil, nil, []string{"raft.wal.fsync is set twice", "raft.fsync"}},
		{"dir and prefix", "[cold]\ndir = \"/a\"\n[cold.s3]\nprefix = \"p\"\n", nil, nil, []string{"storage.cold.root is set twice"}},
		{"old and new section", "[cold]\nflush_bytes = 1\n[storage.cold]\nflush_bytes = 2\n", nil, nil, []string{"storage.cold.flush_bytes is set twice", "cold.flush_bytes"}},
		{"bad value in the file", "[raft]\nnode_id = \"one\"\n", nil, nil, []string{"node_id"}},
		{"unknown variable", "", nil, []string{"URSULA_RAFT_WAL_BACKEND=memory"}, []string{"URSULA_RAFT_WAL_BACKEND", "names no setting"}},
		{"unknown variable of a top-level setting", "", nil, []string{"URSULA_TARGET_ROLES=all"}, []string{"URSULA_TARGET_ROLES"}},
		{"bad value in a variable", "", nil, []string{"URSULA_RAFT_NODE_ID=one"}, []string{"URSULA_RAFT_NODE_ID", "raft.node_id", `"one"`}},
		{"bad duration in a variable", "", nil, []string{"URSULA_GATEWAY_LONG_POLL_TIMEOUT=soon"}, []string{"URSULA_GATEWAY_LONG_POLL_TIMEOUT"}},
		{"variable and its old name", "", nil, []string{"URSULA_RAFT_FSYNC=always", "URSULA_RAFT_WAL_FSYNC=never"}, []string{"URSULA_RAFT_FSYNC", "URSULA_RAFT_WAL_FSYNC", "both set"}},
		{"bad peers", "", []string{"-raft.peers=1/a:1"}, nil, []string{"raft.peers", "<id>/<cluster_url>/<client_url>"}},
		{"unknown flag", "", []string{"-raft.wal.backend=memory"}, nil, []string{"-raft.wal.backend"}},
		{"stray argument", "", []string{"node"}, nil, []string{`unexpected argument "node"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.file != "" {
				args = append([]string{"-config", writeFile(t, tc.file)}, args...)
			}
			_, _, err := load(args, tc.env, TargetAll)
			if err == nil {
				t.Fatal("load accepted it")
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestSeedSettings: the settings the seed names, and what they mean.
func TestSeedSettings(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     []string
		wantErr string
		check   func(*testing.T, *Config)
	}{
		{"fs root defaults below the WAL", []string{"-raft.wal.path=/w"}, nil, "", func(t *testing.T, c *Config) {
			if c.Storage.Cold.Root != filepath.Join("/w", "cold") || c.Storage.Cold.Dir != c.Storage.Cold.Root || c.Engine.DataDir != "/w" {
				t.Fatalf("cold %+v, data dir %q", c.Storage.Cold, c.Engine.DataDir)
			}
		}},
		{"s3 root is the prefix", []string{"-storage.cold.backend=s3", "-storage.cold.s3.bucket=b", "-storage.cold.root=runs/2026-12-01"}, nil, "", func(t *testing.T, c *Config) {
			if c.Storage.Cold.S3.Prefix != "runs/2026-12-01" || c.Storage.Cold.Dir != "" {
				t.Fatalf("cold %+v", c.Storage.Cold)
			}
		}},
		{"external payloads", nil, []string{"URSULA_RUNTIME_EXTERNAL_PAYLOAD_MIN_SIZE=0"}, "", func(t *testing.T, c *Config) {
			if c.Engine.Cold.ExternalMinBytes != 0 || c.Runtime.ExternalPayloadMinSize != 0 {
				t.Fatalf("runtime %+v", c.Runtime)
			}
		}},
		{"core count defaults to the CPUs", nil, nil, "", func(t *testing.T, c *Config) {
			if c.Runtime.CoreCount < 1 || c.Engine.ShardCount != c.Runtime.CoreCount {
				t.Fatalf("core_count %d, shards %d", c.Runtime.CoreCount, c.Engine.ShardCount)
			}
		}},
		{"inline snapshots", []string{"-storage.snapshot.backend=inline"}, nil, "", nil},
		{"s3 snapshots", nil, []string{"URSULA_STORAGE_SNAPSHOT_BACKEND=s3"}, "S3 snapshots are not supported", nil},
		{"peers by flag", []string{"-raft.node_id=2", "-server.insecure_cluster_plaintext", "-raft.peers=1/127.0.0.1:4439/127.0.0.1:4447,2/127.0.0.1:5439/127.0.0.1:5447"}, nil, "", func(t *testing.T, c *Config) {
			want := []cluster.Peer{{ID: 1, ClusterURL: "127.0.0.1:4439", ClientURL: "127.0.0.1:4447"}, {ID: 2, ClusterURL: "127.0.0.1:5439", ClientURL: "127.0.0.1:5447"}}
			if !slices.Equal(c.Engine.Peers, want) {
				t.Fatalf("peers %v", c.Engine.Peers)
			}
		}},
		{"log levels by variable", nil, []string{"URSULA_LOG_LEVELS=engine=debug,gateway=warn"}, "", func(t *testing.T, c *Config) {
			if c.Log.Levels["engine"] != "debug" || c.Log.Levels["gateway"] != "warn" {
				t.Fatalf("levels %v", c.Log.Levels)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := load(tc.args, tc.env, TargetAll)
			if err != nil {
				t.Fatalf("load: %v", err)
			}
			checkValidate(t, cfg, tc.wantErr, tc.check)
		})
	}
}

// TestHelpListsEverySetting: -h and -help answer flag.ErrHelp, and the
// usage lists every setting of every target with its default and
// environment variable, and no deprecated name as a setting.
func TestHelpListsEverySetting(t *testing.T) {
	for _, arg := range []string{"-h", "-help", "--help"} {
		if _, _, err := load([]string{arg}, nil, TargetAll); !errors.Is(err, flag.ErrHelp) {
			t.Errorf("load(%s) = %v, want flag.ErrHelp", arg, err)
		}
	}
	for _, target := range targets {
		t.Run(target, func(t *testing.T) {
			var buf bytes.Buffer
			writeUsage(&buf, "ursula-x", target)
			out := buf.String()
			fs := registered(t, target)
			for s := range settingNames(fs) {
				f := fs.Lookup(s)
				if !strings.Contains(out, "\n  -"+s+" ") {
					t.Errorf("-h does not list -%s", s)
				}
				if !strings.Contains(out, "env "+EnvName(s)+"\n") {
					t.Errorf("-h does not give %s's variable %s", s, EnvName(s))
				}
				if f.DefValue != "" && !strings.Contains(out, f.DefValue) {
					t.Errorf("-h does not give %s's default %s", s, f.DefValue)
				}
			}
			for _, old := range []string{"-data-dir", "-node.listen", "-raft.fsync ", "-cold.dir"} {
				if strings.Contains(out, "\n  "+old) {
					t.Errorf("-h lists the deprecated %s as a setting", old)
				}
			}
			for _, m := range metaFlags {
				if !strings.Contains(out, "  -"+m) {
					t.Errorf("-h does not list -%s", m)
				}
			}
		})
	}
	var node bytes.Buffer
	writeUsage(&node, "ursula-node", TargetNode)
	if !strings.Contains(node.String(), "-server.listen string\n        client plane address (gRPC + HTTP)\n        default \":4437\"") {
		t.Errorf("ursula-node's -h does not show its own server.listen default")
	}
}

func TestVersion(t *testing.T) {
	cfg, flags, err := load([]string{"-version"}, []string{"URSULA_RAFT_NODE_ID=bad"}, TargetNode)
	if err != nil || cfg != nil || !flags.Version {
		t.Fatalf("load(-version) = %v, %+v, %v; want only Flags.Version", cfg, flags, err)
	}
	var buf bytes.Buffer
	writeVersion(&buf, binaryName("/usr/bin/ursula-node", TargetNode))
	want := buildinfo.Get().String("ursula-node") + "\n"
	if buf.String() != want {
		t.Fatalf("-version printed %q, want %q", buf.String(), want)
	}
	info := buildinfo.Get()
	for _, part := range []string{info.Version, info.Commit, info.GoVersion} {
		if !strings.Contains(buf.String(), part) {
			t.Errorf("-version output %q lacks %q", buf.String(), part)
		}
	}
	if got := binaryName("", TargetGateway); got != "ursula-gateway" {
		t.Errorf("binaryName without a path = %q", got)
	}
}

// TestConfigurationReference keeps docs/configuration.md what the flags
// say; -update rewrites it.
func TestConfigurationReference(t *testing.T) {
	var buf bytes.Buffer
	writeReference(&buf)
	path := filepath.Join("..", "..", "docs", "configuration.md")
	if *update {
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	have, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, buf.Bytes()) {
		t.Fatalf("%s is stale: go test ./services/app -run TestConfigurationReference -update", path)
	}
	// Every setting is in it.
	fs := registered(t, TargetAll)
	var missing []string
	for s := range settingNames(fs) {
		if !bytes.Contains(have, []byte("| `"+s+"` | `"+EnvName(s)+"` |")) {
			missing = append(missing, s)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("%s lacks %v", path, missing)
	}
}

// TestEveryVariableSetsItsSetting: URSULA_<NAME> reaches every setting,
// and a flag given too wins.
func TestEveryVariableSetsItsSetting(t *testing.T) {
	samples := map[string]string{"bool": "true", "int": "7", "uint": "7", "duration": "7s", "float": "0.7", "string": "x"}
	for _, s := range listSettings(TargetAll) {
		t.Run(s.Key, func(t *testing.T) {
			v, ok := samples[s.Type]
			switch {
			case s.Key == "raft.peers":
				v = "1/a:1/a:2"
			case s.Key == "log.levels":
				v = "engine=debug"
			case s.Type == "list":
				v = "a,b"
			case !ok:
				t.Fatalf("no sample value of type %s", s.Type)
			}
			if s.Type == "bool" && s.Default == "true" {
				v = "false"
			}
			fs := registered(t, TargetAll)
			if err := applyEnv(fs, []string{EnvName(s.Key) + "=" + v}, nil); err != nil {
				t.Fatalf("%s=%s: %v", EnvName(s.Key), v, err)
			}
			if s.Type != "list" {
				if got := fs.Lookup(s.Key).Value.String(); got != v && !(s.Type == "duration" && got == "7s") {
					t.Fatalf("%s=%s set %s to %q", EnvName(s.Key), v, s.Key, got)
				}
			}
			if err := applyEnv(fs, []string{EnvName(s.Key) + "=" + v, EnvName(s.Key) + "_X=1"}, nil); err == nil || !strings.Contains(err.Error(), EnvName(s.Key)+"_X") {
				t.Errorf("%s_X accepted: %v", EnvName(s.Key), err)
			}
		})
	}
}
