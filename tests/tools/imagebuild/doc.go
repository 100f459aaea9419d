// Package imagebuild writes Ursula's container image without a container
// engine and without a base image: `make image` runs it (through
// tests/tools/cmd/ursula-image) over statically linked binaries, and the
// deployment tests (tests/tools/deploy/image) run it again to check that
// the same inputs give the same bytes.
//
// # Contents
//
// Two layers, each an uncompressed tar (PAX format) with entries sorted by
// name, owner root unless said otherwise, and every modification time set
// to Config.Created; no entry depends on the build machine but a copied
// binary's content:
//
//	base      etc/passwd, etc/group       root (0) and ursula (65532)
//	          etc/nsswitch.conf           "hosts: files dns"
//	          etc/ssl/certs/ca-certificates.crt
//	                                      Mozilla's roots, as PEM, from the
//	                                      Go module golang.org/x/crypto/
//	                                      x509roots/fallback (its version is
//	                                      pinned in tests/tools/go.mod);
//	                                      roots with extra constraints
//	                                      (distrust-after dates), which a
//	                                      PEM file cannot express, are left
//	                                      out
//	          data/ (ursula, 0750), tmp/ (1777)
//	binaries  usr/, usr/local/, usr/local/bin/
//	                                      directories, mode 0755
//	          usr/local/bin/<binary>      regular file, mode 0755, for each
//	                                      of Binaries (ursula, ursulactl)
//	          usr/local/bin/<role link>   symbolic link (tar type '2'),
//	                                      mode 0777, size 0, link name
//	                                      "ursula" (LinkTarget, relative),
//	                                      for each of RoleLinks
//	                                      (ursula-backup, ursula-coldgc,
//	                                      ursula-gateway, ursula-node)
//
// The per-role names are links, not copies: ursula runs as the binary
// named by os.Args[0] (services/app.TargetForName), so
// /usr/local/bin/ursula-node is ursula-node, and the image holds one
// server binary instead of five identical ones.
//
// The image runs as 65532:65532, with entrypoint /usr/local/bin/ursula,
// working directory /data, PATH=/usr/local/bin, the ports of Ports exposed,
// and the OCI labels org.opencontainers.image.{title,version,revision,
// source,created}.
//
// # Archive format
//
// One tar file that is both an OCI image layout (oci-layout, index.json,
// blobs/sha256/<digest>) and a `docker load` archive (manifest.json, whose
// Config and Layers name the same blobs): Docker 25+ reads the former,
// older engines and podman the latter. The image is tagged twice,
// <repository>:<version> and <repository>:latest (what deploy/compose
// runs). Layers are stored uncompressed
// (media type application/vnd.oci.image.layer.v1.tar), so a layer's
// digest is its diff id; compression would cost time on every build and
// buy nothing for a local archive. Entries are in name order and carry
// Config.Created as their time.
package imagebuild
