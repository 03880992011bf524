package mem_test

import (
	"testing"

	"github.com/spate-go/spate/conformance"
)

func TestCoordinatorConformance(t *testing.T) {
	conformance.RunCoordinator(t, newHarness, conformance.VirtualTime())
}

func BenchmarkConformance(b *testing.B) { conformance.RunBenchmarks(b, newHarness) }
