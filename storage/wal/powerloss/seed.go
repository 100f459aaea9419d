package powerloss

import (
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
)

// SeedEnv names the environment variable that fixes the seed Seed returns,
// to replay a failing run.
const SeedEnv = "URSULA_POWERLOSS_SEED"

// Seed returns a seed for a Loss, logged in tb's output so that a failing
// run can be replayed: the value of SeedEnv when it is set, otherwise a
// random one.
func Seed(tb testing.TB) uint64 {
	tb.Helper()
	if v := os.Getenv(SeedEnv); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			tb.Fatalf("%s=%q: %v", SeedEnv, v, err)
		}
		tb.Logf("power loss seed %d (from %s)", s, SeedEnv)
		return s
	}
	s := rand.Uint64()
	tb.Logf("power loss seed %d (replay with %s=%d)", s, SeedEnv, s)
	return s
}
