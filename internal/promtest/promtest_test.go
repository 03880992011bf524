package promtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
)

func TestValue(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total"}, []string{"a", "b"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h"})
	reg.MustRegister(c, g, h)
	c.WithLabelValues("x", "y").Add(3)
	c.WithLabelValues("x", "z").Add(5)
	g.Set(7)
	h.Observe(1)
	h.Observe(2)
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
		ok     bool
	}{
		{"c_total", []string{"a", "x", "b", "z"}, 5, true},
		{"c_total", []string{"b", "y"}, 3, true},
		{"c_total", []string{"b", "nope"}, 0, false},
		{"g", nil, 7, true},
		{"h", nil, 2, true},
		{"absent", nil, 0, false},
	} {
		v, ok, err := Value(reg, tc.name, tc.labels...)
		assert.NoError(t, err, "Value(%s, %v)", tc.name, tc.labels)
		assert.Equal(t, tc.ok, ok, "Value(%s, %v): ok", tc.name, tc.labels)
		assert.Equal(t, tc.want, v, "Value(%s, %v): value", tc.name, tc.labels)
	}
}
