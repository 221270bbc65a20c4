package appliance

// TrustedTimeMSMax is the largest time_ms a node takes from a check-in
// answer (9999-12-31T23:59:59.999Z); a larger one is refused with a reason
// (kernel: TT_MS_MAX in node/ttime.inc).
const TrustedTimeMSMax = 253402300799999

// TrustedNowSeconds is the kernel's trusted time after a pinned https://
// check-in (kernel: tt_seconds, node/ttime.inc): the answer's time_ms plus
// the TSC cycles elapsed since its receipt at perMS cycles per millisecond
// (0: uncalibrated, the 1 GHz guess), in whole Unix seconds, truncated.
// Sums wrap modulo 2^64 as the kernel's do; with time_ms at most
// TrustedTimeMSMax and a calibrated TSC they never reach it. Compared with
// the kernel by the self-test digest "ttime".
func TrustedNowSeconds(timeMS, cycles, perMS uint64) uint64 {
	if perMS == 0 {
		perMS = TSCGuessCyclesPerMS
	}
	return (timeMS + cycles/perMS) / 1000
}
