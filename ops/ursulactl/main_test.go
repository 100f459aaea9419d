package ursulactl

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package on a goroutine left running (observations,
// HTTP connections after Run).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
