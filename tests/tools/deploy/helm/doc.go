// Package helm tests the Helm chart deploy/helm/ursula without a cluster
// and without the helm binary: it lints the chart strictly and renders it
// with the Helm Go SDK, decodes every rendered object strictly into its
// Kubernetes API type (an unknown or misspelled field fails), checks what
// the chart promises (voter ids from the ordinal, the grace period, the
// readiness path, the disruption budget, anti-affinity, the `helm test`
// pod), checks that values.schema.json refuses invalid values naming them,
// and passes the rendered configuration files to the product's own
// loader (bin/ursula-* -verify-config).
//
// Run by `make test-deploy` (after `make build`).
package helm
