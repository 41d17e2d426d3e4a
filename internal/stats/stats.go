// Package stats holds the few statistics the benchmarks report: the mean
// of repeated runs and the half-width of its 95% confidence interval.
package stats

import "math"

// MeanInterval95 returns the mean of xs and the half-width of its 95%
// interval (Student's t over len(xs)-1 degrees of freedom); the half-width
// is 0 for fewer than two values, the mean NaN for none.
func MeanInterval95(xs []float64) (mean, half float64) {
	n := float64(len(xs))
	for _, x := range xs {
		mean += x
	}
	mean /= n
	if len(xs) < 2 {
		return mean, 0
	}
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	return mean, TQuantile975(len(xs)-1) * math.Sqrt(ss/(n-1)/n)
}

// TQuantile975 is Student's t 0.975 quantile for df (≥ 1) degrees of
// freedom.
func TQuantile975(df int) float64 {
	table := []float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228}
	if df <= len(table) {
		return table[df-1]
	}
	return 1.96 + 2.4/float64(df) // within 1% of the exact value beyond ten
}
