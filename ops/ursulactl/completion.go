package ursulactl

import (
	"strconv"

	"github.com/spf13/cobra"
)

// Shell completion: cobra's completion command (bash, zsh, fish,
// powershell) completes verbs and flags; addCompletions adds the values
// that are cheap to know: node ids from the manifest (--node, --to),
// backup-verify's depths, and no file names where a number is expected.
// Nothing here reaches a node.

// depthNames are backup-verify's --depth values.
var depthNames = []string{"manifest", "objects", "deep"}

// addCompletions registers value completions on every command of the tree
// under root that has the flags.
func addCompletions(a *app, root *cobra.Command) {
	nodes := func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		m, err := LoadManifest(a.o.manifest)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		out := make([]string, 0, len(m.Nodes))
		for _, n := range m.Nodes {
			desc := n.ClientURL
			if n.Name != "" {
				desc = n.Name + " " + desc
			}
			out = append(out, strconv.FormatUint(n.ID, 10)+"\t"+desc)
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
	fixed := func(vals ...string) cobra.CompletionFunc {
		return func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
			return vals, cobra.ShellCompDirectiveNoFileComp
		}
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for name, f := range map[string]cobra.CompletionFunc{
			"node":   nodes,
			"to":     nodes,
			"depth":  fixed(depthNames...),
			"group":  fixed(),
			"level":  fixed(),
			"upto":   fixed(),
			"voters": fixed(),
			"limit":  fixed(),
			"nodes":  fixed(),
			"days":   fixed(),
			"role":   fixed("gateway", "coldgc", "backup"),
			"dir":    dirsOnly,
		} {
			if c.LocalNonPersistentFlags().Lookup(name) != nil {
				_ = c.RegisterFlagCompletionFunc(name, f)
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

func dirsOnly(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return nil, cobra.ShellCompDirectiveFilterDirs
}
