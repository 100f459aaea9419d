package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
)

// version is the release version and commit the VCS revision, set at
// link time (make build); a build that did not set commit falls back to
// the revision the Go toolchain stamped, when it stamped one (it does not
// under -buildvcs=false).
var (
	version = "dev"
	commit  = ""
)

// Info describes one build.
type Info struct {
	// Version is the release version ("dev" for an unreleased build).
	Version string `json:"version"`
	// Commit is the VCS revision the binary was built from, with
	// "-dirty" when the work tree had uncommitted changes; "unknown" when
	// the build recorded none (go run, a build outside the repository).
	Commit string `json:"commit"`
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string `json:"go_version"`
}

var (
	once sync.Once
	info Info
)

// Get returns this binary's build.
func Get() Info {
	once.Do(func() {
		info = Info{Version: version, Commit: "unknown", GoVersion: runtime.Version()}
		if commit != "" {
			info.Commit = commit
		}
		bi, ok := debug.ReadBuildInfo()
		if !ok {
			return
		}
		var modified bool
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if commit == "" {
					info.Commit = s.Value
				}
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if modified && commit == "" && info.Commit != "unknown" {
			info.Commit += "-dirty"
		}
		if info.Version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			// Installed with go install module@version.
			info.Version = bi.Main.Version
		}
	})
	return info
}

// String is the line a binary prints for -version: "<binary> <version>
// (commit <commit>, <go version>)".
func (i Info) String(binary string) string {
	return fmt.Sprintf("%s %s (commit %s, %s)", binary, i.Version, i.Commit, i.GoVersion)
}
