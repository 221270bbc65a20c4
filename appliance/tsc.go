package appliance

import "math/bits"

// The kernel's TSC calibration (kernel/core/tsc.inc): every deadline in the
// shard runtime is a TSC value, so cycles per millisecond is the speed of the
// kernel's clock. A run reads a reference counter (PIT channel 2 or the HPET)
// at its two ends only, each read bracketed by two TSC reads; the time in
// between may be lost to a busy host without changing the result. These are
// the Go reference of its arithmetic, compared with the kernel by the
// self-test digest "tsccal".
const (
	// PITHz is the 8254's input clock (1.193182 MHz).
	PITHz = 1193182
	// FemtosecondsPerMS converts an HPET period (fs per tick) to ticks per ms.
	FemtosecondsPerMS = 1_000_000_000_000
	// TSCCalBracketShift bounds a run's two brackets together to its TSC
	// span >> 10 (about 0.1 %): a wider one means the CPU was taken away
	// at an end of the run, and the run is refused.
	TSCCalBracketShift = 10
)

// TSCCalResult is one calibration run's TSC cycles per millisecond,
// span * num / (ticks * den), where the reference counts num/den ticks per
// millisecond (the PIT: PITHz/1000; an HPET: FemtosecondsPerMS/period). It
// refuses (false) a run without ticks or den, whose brackets are wider than
// span >> TSCCalBracketShift, whose divisor or quotient overflows 64 bits, or
// whose result is 0 (kernel: tsc_cal_result).
func TSCCalResult(span, ticks, brackets, num, den uint64) (uint64, bool) {
	if ticks == 0 || den == 0 || brackets > span>>TSCCalBracketShift {
		return 0, false
	}
	hi, div := bits.Mul64(ticks, den)
	if hi != 0 {
		return 0, false
	}
	hi, lo := bits.Mul64(span, num)
	if hi >= div {
		return 0, false
	}
	q, _ := bits.Div64(hi, lo, div)
	if q == 0 {
		return 0, false
	}
	return q, true
}

// Median3 is the middle one of three values (kernel: tsc_median3); the
// calibration takes the median of three accepted runs.
func Median3(a, b, c uint64) uint64 {
	return max(min(a, b), min(max(a, b), c))
}
