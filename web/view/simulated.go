package view

import "strings"

// SimulatedPrefix starts the ID of a simulated node: `make run` falls back
// to nodes simulated over HTTP (tools/lab) where QEMU nodes cannot boot,
// and names them sim-1, sim-2, ... The controller does not know the
// difference; the dashboard labels them so nobody takes them for machines.
const SimulatedPrefix = "sim-"

// Simulated reports whether a node ID names a simulated node.
func Simulated(nodeID string) bool { return strings.HasPrefix(nodeID, SimulatedPrefix) }
