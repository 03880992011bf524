// Package promtest reads gathered Prometheus series in tests.
package promtest

import "github.com/prometheus/client_golang/prometheus"

// Value is the value of the first series named name whose labels include
// every name/value pair in labels: a counter's or a gauge's value, or a
// histogram's sample count. ok is false when no series matches.
func Value(g prometheus.Gatherer, name string, labels ...string) (v float64, ok bool, err error) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, false, err
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue(), true, nil
			case m.Gauge != nil:
				return m.Gauge.GetValue(), true, nil
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount()), true, nil
			}
		}
	}
	return 0, false, nil
}
