package appliance

import (
	"math/bits"
	"time"
)

// This file is the Go reference of the grant rule of an Identify claim
// (issue 22): a granted answer is used only if it arrived soon after the
// node started the claim. The kernel's copy is shard_grant_usable
// (kernel/shard/shard.inc), compared by the self-test digest "grant".
//
// Why: the controller answers the grants of one bucket at least a window W
// apart. A node records the time just before it starts a claim (before it
// connects or sends: an earlier time is the safe side) and sends Identify
// at once on a usable grant, within G = use_within_ms of that time. The
// claim is sent before its answer is written, so each Identify leaves the
// node within G after its grant's answer at the latest and no earlier than
// G before it, and two Identifies of one bucket leave their nodes at least
// W - G apart, however late either answer travelled.

// DefaultGrantUseWithinMS is the validity of a grant whose answer carries
// no use_within_ms (the default window's 250 ms guard).
const DefaultGrantUseWithinMS = 250

// DiscordIdentifyInterval is Discord's spacing of Identifies per bucket
// (research gateway-protocol-and-sharding.md §1.11).
const DiscordIdentifyInterval = 5 * time.Second

// GrantUseWithin is the validity G the controller gives a grant for an
// Identify window w: the part of the window beyond Discord's 5 s, so that
// W - G is Discord's interval; for a window of 5 s or less (a test Gateway
// scaled down in time), the same one-21st share the default 5.25 s window
// has, at least 1 ms.
func GrantUseWithin(w time.Duration) time.Duration {
	if w > DiscordIdentifyInterval {
		return w - DiscordIdentifyInterval
	}
	return max(w/21, time.Millisecond)
}

// TSCGuessCyclesPerMS is the kernel's TSC rate when calibration failed
// (kernel/core/tsc.inc TSC_GUESS_PER_MS): 1 GHz.
const TSCGuessCyclesPerMS = 1_000_000

// GrantUsable reports whether a granted Identify claim may still be used
// when its answer arrives elapsed after the node started the claim: elapsed
// at most useWithinMS milliseconds (DefaultGrantUseWithinMS when 0).
func GrantUsable(elapsed time.Duration, useWithinMS uint32) bool {
	if useWithinMS == 0 {
		useWithinMS = DefaultGrantUseWithinMS
	}
	// A negative elapsed (a clock that went backwards) proves nothing.
	return elapsed >= 0 && elapsed <= time.Duration(useWithinMS)*time.Millisecond
}

// GrantUsableTSC is GrantUsable on the node's clock, as the kernel computes
// it: elapsedCycles TSC cycles at cyclesPerMS (TSCGuessCyclesPerMS when 0)
// are within useWithinMS milliseconds. The limit is computed in 128 bits,
// so no product overflows.
func GrantUsableTSC(elapsedCycles, cyclesPerMS uint64, useWithinMS uint32) bool {
	return elapsedCycles <= grantLimitTSC(cyclesPerMS, useWithinMS)
}

// grantLimitTSC is a grant's validity in TSC cycles, all ones when the
// product does not fit 64 bits (the kernel's shard_grant_usable returns the
// same value in RAX).
func grantLimitTSC(cyclesPerMS uint64, useWithinMS uint32) uint64 {
	if useWithinMS == 0 {
		useWithinMS = DefaultGrantUseWithinMS
	}
	if cyclesPerMS == 0 {
		cyclesPerMS = TSCGuessCyclesPerMS
	}
	hi, lo := bits.Mul64(uint64(useWithinMS), cyclesPerMS)
	if hi != 0 {
		return ^uint64(0)
	}
	return lo
}
