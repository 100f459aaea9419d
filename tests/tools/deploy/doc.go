// Package deploy holds the deployment tests (make test-deploy): one
// package per thing shipped, each checking it with the loader or tool its
// users run it with: image (the container image of make image), compose
// (deploy/compose) and systemd (the units in deploy/). They read what
// make image built, named by environment variables the Makefile sets.
package deploy
