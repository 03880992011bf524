package mem_test

import (
	"testing"

	"github.com/spate-go/spate/conformance"
)

func TestCoordinatorConformance(t *testing.T) {
	conformance.RunCoordinator(t, newHarness, conformance.VirtualTime())
}

func BenchmarkConformance(b *testing.B) { conformance.RunBenchmarks(b, newHarness) }

func TestChaos(t *testing.T) {
	conformance.RunChaos(t, newHarness, conformance.ChaosOptions{Seeds: 30}, conformance.VirtualTime())
}
