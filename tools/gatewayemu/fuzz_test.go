package gatewayemu

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// FuzzDecodePayload feeds arbitrary client frames through the envelope and
// opcode decoders: they must never panic, and every failure must be one of
// the two sentinel errors the connection maps to 4002 and 4001.
func FuzzDecodePayload(f *testing.F) {
	for _, s := range []string{
		`{"op":1,"d":null}`,
		`{"op":2,"d":{"token":"t","intents":513,"properties":{"os":"x"},"shard":[0,1]}}`,
		`{"op":6,"d":{"token":"t","session_id":"s","seq":3}}`,
		`{"op":2,"d":{"token":"t","intent":1}}`,
		`{"op":"2"}`, `[]`, `null`, `{"op":2,"d":"x"}`, `{"op":2,"d":{}} trailing`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := decodeEnvelope(b)
		if err != nil {
			if !errors.Is(err, ErrDecode) {
				t.Fatalf("envelope error %v is not ErrDecode", err)
			}
			return
		}
		for _, lenient := range []bool{false, true} {
			var id identifyData
			if err := decodeStrict(p.D, &id, lenient); err != nil && !errors.Is(err, ErrInvalidPayload) {
				t.Fatalf("identify error %v is not ErrInvalidPayload", err)
			}
			var rd resumeData
			if err := decodeStrict(p.D, &rd, lenient); err != nil && !errors.Is(err, ErrInvalidPayload) {
				t.Fatalf("resume error %v is not ErrInvalidPayload", err)
			}
		}
	})
}

// FuzzDecodeFault checks the fault decoder and validation never panic.
func FuzzDecodeFault(f *testing.F) {
	for _, s := range []string{`{"kind":"close","code":4000}`, `{"kind":"dispatch","event":"X","data":{}}`, `{"kind":"delay_hello","delay_ms":-1}`} {
		f.Add(s)
	}
	emu, err := New(Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fl, err := DecodeFault(strings.NewReader(s))
		if err != nil {
			if !errors.Is(err, ErrBadFault) {
				t.Fatalf("%v is not ErrBadFault", err)
			}
			return
		}
		if fl.Kind == FaultDelayHello || fl.Kind == FaultResetBudget || fl.Kind == FaultStopAck || fl.Kind == FaultResumeAck {
			return // these change emulator-wide settings; covered by unit tests
		}
		if _, err := emu.Inject(fl); err != nil && !errors.Is(err, ErrBadFault) && !errors.Is(err, ErrNoTarget) {
			t.Fatalf("Inject(%+v): %v", fl, err)
		}
	})
}

func TestRunScript(t *testing.T) {
	t.Parallel()
	emu := startEmu(t, fastOptions())
	ok := "# comment\n\n{\"at_ms\":0,\"kind\":\"stop_ack\",\"shard\":2}\n{\"at_ms\":5,\"kind\":\"reconnect\"}\n{\"at_ms\":5,\"kind\":\"reset_budget\"}\n"
	if err := emu.RunScript(context.Background(), strings.NewReader(ok)); err != nil {
		t.Fatal(err)
	}
	if st := emu.State(); len(st.AckSuppressed) != 1 || st.AckSuppressed[0] != 2 {
		t.Fatalf("script not applied: %+v", st.AckSuppressed)
	}
	for _, bad := range []string{
		`{"at_ms":0,"kind":"explode"}`,
		`{"at_ms":0,"kind":"drop","typo":1}`,
		"{\"at_ms\":10,\"kind\":\"drop\"}\n{\"at_ms\":5,\"kind\":\"drop\"}",
		`not json`,
	} {
		if err := emu.RunScript(context.Background(), strings.NewReader(bad)); err == nil {
			t.Errorf("script %q accepted", bad)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := emu.RunScript(ctx, strings.NewReader(`{"at_ms":60000,"kind":"drop"}`)); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled script: %v", err)
	}
}
