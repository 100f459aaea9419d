package app

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/ursula/ursula/internal/buildinfo"
)

// usageIntro explains the vocabulary, in -h and in docs/configuration.md.
const usageIntro = `Every setting has one dotted name: its key in the TOML file given by
-config, its flag (-raft.wal.fsync always) and its environment variable
(URSULA_RAFT_WAL_FSYNC=always: URSULA_, then the name in upper case with
dots and dashes turned into underscores). Precedence: defaults < file <
environment < flags. An unknown key in the file, or an unknown URSULA_*
variable whose first word is a section (URSULA_RAFT_...), is an error.

Lists are comma-separated (-upstream.nodes 10.0.0.1:4437,10.0.0.2:4437);
log.levels takes component=level pairs (engine=debug,gateway=warn);
raft.peers takes <id>/<cluster_url>/<client_url> entries
(1/10.0.0.1:4439/10.0.0.1:4437,2/...), the [[raft.peers]] tables of the file.

Deprecated names, accepted with a warning for one release: raft.fsync
(raft.wal.fsync), raft.data_dir (raft.wal.path), the [cold] section
([storage.cold]) with cold.dir and cold.s3.prefix (storage.cold.root) and
cold.external_min_bytes (runtime.external_payload_min_size), and the flags
of earlier releases (-data-dir, -node.listen, -admin.listen, -cluster.listen,
dashes instead of underscores, ...).`

// metaUsage lists the flags that are not settings.
const metaUsage = `  -config file
        TOML configuration file
  -print-config
        print the effective configuration as TOML and exit
  -verify-config
        validate the configuration and exit
  -version
        print the version, commit and Go version and exit
  -h, -help
        print this help and exit`

// TargetForName is the default target of a binary run under the name
// arg0 (os.Args[0]): a per-role binary's name (ursula-node,
// ursula-gateway, ursula-coldgc, ursula-backup) selects its target,
// anything else "all". The ursula binary's main passes it to Main, so a
// link named ursula-node to ursula runs exactly as ursula-node does: the
// same default target, defaults, -version and -h name and service.name.
func TargetForName(arg0 string) string {
	name := filepath.Base(arg0)
	for target, binary := range serviceNames {
		if binary == name {
			return target
		}
	}
	return TargetAll
}

// binaryName is the name a binary reports itself by: its file name, or the
// default binary of target.
func binaryName(arg0, target string) string {
	if b := filepath.Base(arg0); b != "" && b != "." && b != string(filepath.Separator) {
		return b
	}
	return serviceNames[target]
}

// writeVersion prints the -version line.
func writeVersion(w io.Writer, binary string) {
	fmt.Fprintln(w, buildinfo.Get().String(binary))
}

// writeUsage prints -h: every setting of target with its type, default,
// environment variable and help, grouped by table.
func writeUsage(w io.Writer, binary, target string) {
	fmt.Fprintf(w, "Usage: %s [-config file] [-setting value ...]\n\n", binary)
	fmt.Fprintf(w, "Runs the %q target (change it with -target).\n\n%s\n\nFlags that are not settings:\n%s\n", target, usageIntro, metaUsage)
	table := "\x00"
	for _, s := range listSettings(target) {
		if s.Table != table {
			table = s.Table
			if table == "" {
				fmt.Fprintf(w, "\nTop level:\n")
			} else {
				fmt.Fprintf(w, "\n[%s]\n", table)
			}
		}
		fmt.Fprintf(w, "  -%s %s\n        %s\n        default %s; env %s\n", s.Key, s.Type, s.Usage, showDefault(s), EnvName(s.Key))
	}
}

func showDefault(s setting) string {
	if s.Default == "" {
		return "none"
	}
	if s.Type == "string" {
		return fmt.Sprintf("%q", s.Default)
	}
	return s.Default
}

// writeReference prints docs/configuration.md: the settings of the
// all-in-one target as one Markdown table per section.
func writeReference(w io.Writer) {
	fmt.Fprint(w, "# Configuration reference\n\n")
	fmt.Fprint(w, "<!-- Generated from the flags of services/app by TestConfigurationReference;\n")
	fmt.Fprint(w, "     regenerate with: go test ./services/app -run TestConfigurationReference -update -->\n\n")
	fmt.Fprintf(w, "%s\n\n", markdownText(usageIntro))
	fmt.Fprint(w, "Every binary (ursula, ursula-node, ursula-gateway, ursula-coldgc, ursula-backup)\n")
	fmt.Fprint(w, "takes every setting; `-h` lists them with the binary's defaults and `-version`\n")
	fmt.Fprint(w, "prints its version, commit and Go version. The defaults below are those of\n")
	fmt.Fprint(w, "`ursula` (target all); `ursula-node` listens on `:4437` (server.listen) and\n")
	fmt.Fprint(w, "`:4439` (server.cluster_listen) instead.\n")
	table := "\x00"
	for _, s := range listSettings(TargetAll) {
		if s.Table != table {
			table = s.Table
			name := "Top level"
			if table != "" {
				name = "[" + table + "]"
			}
			fmt.Fprintf(w, "\n## %s\n\n| Setting | Environment variable | Type | Default | Description |\n|---|---|---|---|---|\n", name)
		}
		def := "`" + s.Default + "`"
		if s.Default == "" {
			def = "none"
		}
		fmt.Fprintf(w, "| `%s` | `%s` | %s | %s | %s |\n", s.Key, EnvName(s.Key), s.Type, def, markdownText(s.Usage))
	}
}

// markdownText escapes what Markdown would read as markup in a table cell.
func markdownText(s string) string {
	return strings.NewReplacer("|", "\\|", "<", "&lt;", ">", "&gt;", "*", "\\*", "_", "\\_").Replace(s)
}
