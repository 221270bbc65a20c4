package appliance

import "time"

// RFC3339Micro is the kernel's Dpxe-Received value (kernel/node/natsnode.inc
// nn_fmt_time): Unix seconds and microseconds as RFC 3339 UTC with nine
// fractional digits, the last three always 0 (the kernel's clock counts
// microseconds): 2006-01-02T15:04:05.000000000Z, 30 bytes for the years
// 1970 to 9999. The self-test digest "rfc3339" compares the two.
func RFC3339Micro(sec int64, micros uint32) string {
	return time.Unix(sec, int64(micros)*1000).UTC().Format("2006-01-02T15:04:05.000000000Z")
}
