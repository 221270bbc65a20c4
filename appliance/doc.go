// Package appliance holds what the shard kernel, the image pipeline and the
// fleet manager must agree on: the node boot configuration, the controller
// wire formats, shard states, the shard context layout the kernel uses, and a
// Go reference implementation of every formula the kernel computes (Identify
// bucket, first-heartbeat jitter, backoff, resume rule, lease gating, guild
// routing). Tests boot the kernel and compare its results with this package.
//
// Nothing here does I/O; every other package may import it.
package appliance
