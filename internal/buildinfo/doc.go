// Package buildinfo says which build a process is: its release version (set
// by the build with -ldflags "-X github.com/ursula/ursula/internal/buildinfo.version=..."),
// the commit it was built from and the Go toolchain, as the Go linker
// recorded them. Every binary prints it for -version, exports it as
// ursula_build_info and as the service.version of its telemetry, and the
// container image is labelled with it.
package buildinfo
