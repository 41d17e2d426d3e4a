package stats

import (
	"math"
	"testing"
)

// TestMeanInterval95 is worked examples: three runs 1, 2, 3 have mean 2,
// standard error 1/√3 and t(2) = 4.303; one run has no interval.
func TestMeanInterval95(t *testing.T) {
	if m, h := MeanInterval95([]float64{1, 2, 3}); m != 2 || math.Abs(h-4.303/math.Sqrt(3)) > 1e-12 {
		t.Errorf("1, 2, 3: %v ± %v", m, h)
	}
	if m, h := MeanInterval95([]float64{5}); m != 5 || h != 0 {
		t.Errorf("one run: %v ± %v", m, h)
	}
	if got := TQuantile975(30); math.Abs(got-2.042) > 0.02 {
		t.Errorf("t(30) = %v, want about 2.042", got)
	}
}
