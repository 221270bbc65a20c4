// Package gatewayemu is an in-process Discord Gateway (API v9/v10, JSON
// encoding) for tests: GET /gateway and /gateway/bot, the WebSocket gateway
// with Hello, Identify validation, READY and GUILD_CREATE, heartbeats,
// Resume with replay, op 7 and op 9, the close codes, the per-bucket Identify
// window, the 120-per-60-s send limit, the 4096-byte payload limit and the
// daily session-start budget, after ../shared/research/gateway-protocol-and-sharding.md.
//
// Options give it the shapes of a real bot's traffic (research
// tls-and-real-gateway.md §5): host-name URLs and a resume host that can
// answer 503, READY with thousands of unavailable guilds, GUILD_CREATEs of
// an exact size up to megabytes, Request Guild Members answered with
// GUILD_MEMBERS_CHUNK under Discord's limit, GUILD_DELETE, fragmented
// messages and compress=zlib-stream. The zero Options keep the small,
// unfragmented defaults.
//
// Every client misbehaviour is recorded as a Violation; tests of other
// packages assert that Violations() is empty. Faults (op 7, op 9, any close
// code, TCP drops, withheld ACKs, delayed Hello) are injected with Inject,
// POST /debug/fault or a fault script. docs/gateway-emulator.md describes the
// behaviour, the choices made where Discord's documentation is silent, and
// the /debug/state format.
//
// Typical use in a test:
//
//	emu, err := gatewayemu.Start(ctx, "127.0.0.1:0", gatewayemu.Options{
//		HeartbeatInterval: 200 * time.Millisecond, IdentifyWindow: 100 * time.Millisecond,
//	})
//	...
//	defer emu.Close()
//	// point the client at emu.APIBase(10) or emu.URL() and run it, then:
//	if v := emu.Violations(); len(v) != 0 { t.Fatalf("gateway violations: %+v", v) }
package gatewayemu
