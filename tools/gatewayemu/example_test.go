package gatewayemu_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/coder/websocket"
	"github.com/discord-pxe/dpxe/tools/gatewayemu"
)

// A test starts the emulator, runs its client against it and asserts that
// the violation record is empty. The client here is a few lines of
// coder/websocket that Identify and heartbeat once.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	emu, err := gatewayemu.Start(ctx, "127.0.0.1:0", gatewayemu.Options{
		Shards: 2, HeartbeatInterval: 5 * time.Second, IdentifyWindow: 100 * time.Millisecond,
	})
	if err != nil {
		panic(err)
	}
	defer emu.Close()

	ws, _, err := websocket.Dial(ctx, emu.URL()+"/?v=10&encoding=json", nil)
	if err != nil {
		panic(err)
	}
	defer ws.CloseNow()
	read := func() (op int, t string) {
		_, b, err := ws.Read(ctx)
		if err != nil {
			panic(err)
		}
		var p struct {
			Op int     `json:"op"`
			T  *string `json:"t"`
		}
		json.Unmarshal(b, &p)
		if p.T != nil {
			t = *p.T
		}
		return p.Op, t
	}
	op, _ := read()
	fmt.Println("hello op", op)
	ws.Write(ctx, websocket.MessageText, []byte(`{"op":2,"d":{"token":"`+emu.Token()+
		`","intents":513,"properties":{"os":"linux","browser":"x","device":"x"},"shard":[0,2]}}`))
	_, t := read()
	fmt.Println("first dispatch", t)
	for range emu.GuildsForShard(0, 2) {
		read() // GUILD_CREATE
	}
	ws.Write(ctx, websocket.MessageText, []byte(`{"op":1,"d":1}`))
	op, _ = read()
	fmt.Println("heartbeat answer op", op)

	ws.Close(websocket.StatusNormalClosure, "done") // 1000 ends the session
	emu.Await(ctx, func(s gatewayemu.State) bool { return len(s.Shards) == 0 })
	fmt.Println("violations", len(emu.Violations()))
	// Output:
	// hello op 10
	// first dispatch READY
	// heartbeat answer op 11
	// violations 0
}
