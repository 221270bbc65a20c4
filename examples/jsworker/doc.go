// Package jsworker holds a bot worker written in JavaScript with only the
// public NATS client (worker.mjs, docs/events.md), and the test that runs
// it with Node.js against a real NATS JetStream server.
package jsworker
