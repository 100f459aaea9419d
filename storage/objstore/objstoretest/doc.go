// Package objstoretest is the test kit of package objstore, importable by
// any test that needs an object store:
//
//   - Contract is the behaviour every objstore.Store must have, as one
//     suite; run it against each implementation (objstore's own tests run it
//     for Memory, FS and S3). A new implementation is done when it passes.
//   - S3Server runs a real S3-compatible server, versitygw with its posix
//     backend, on 127.0.0.1 with a temporary data directory: NewS3Server for
//     one test (closed by t.Cleanup), StartS3Server for a TestMain.
//     CreateBucket and S3Config give a store on it. Stop kills the process
//     (SIGKILL, like a crash or an outage) and Start brings it back on the
//     same port with the same data, for outage tests.
//
// The versitygw binary is $VERSITYGW (the Makefile's test targets set it),
// else bin/versitygw at the root of the ursula module, else versitygw on
// PATH. Without one the test fails, never skips: run `make bin/versitygw`.
//
// versitygw stores objects as files, so it shares the FS store's limits: a
// key cannot also be the directory of another key. Its posix backend also
// races a delete that empties a directory against a write into it and may
// answer the write 409 ExistingObjectIsDirectory; objstore.S3 retries that.
package objstoretest
